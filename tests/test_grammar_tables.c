/* Grammar masks from the precomputed token classes (src/text/grammar_tables.c) against the
 * trie walk (the oracle, a matcher without tables): over JSON schemas with nesting, enums,
 * anyOf and $ref, json_object, regexes, GBNF, a choice and a grammar nested past the depth
 * limit, random walks compare the two masks bit for bit at every step (and whether the output
 * may end). The vocabulary is the 256 bytes plus random multi-byte tokens over JSON's
 * characters, so tokens cross rule ends (a string's closing quote, a number's last digit)
 * at every offset. A third matcher, new for every walk, shares the tables with the second: its
 * masks come from the tables' memo (grammar_memo.c: the masks per state and the dependent sets
 * per pop node and stack below) that the earlier walks filled, and must be the same bits. */
#include "check.h"
#include "grammar.h"

#include <stdlib.h>
#include <string.h>

enum { NRAND = 1500, MAXTOK = 9 };
static int V;
static ds41_gvocab *voc;
static const char **tp;
static size_t *tl;
static char tokb[256 + NRAND][MAXTOK];

static unsigned rng = 2024;
static int pairs_built;   /* by the last differ(): pair tables (a string's characters have them) */
static long long memo_hits, memo_misses, memo_masks;   /* by the last differ(): dependent sets from the memo,
                                                          * walked, and masks copied from it */
static unsigned rnd(void) { rng = rng * 1103515245u + 12345u; return rng >> 8; }

static void make_vocab(void) {
    static const char *alpha[] = { "\"", "{", "}", "[", "]", ":", ",", " ", "\n", "a", "b", "e", "x", "1", "0", "9", "-",
                                   ".", "+", "\\", "n", "u", "t", "r", "l", "s", "f", "\xc3\xa9", "\xe2\x82\xac", "(", ")" };
    int na = (int)(sizeof alpha / sizeof alpha[0]);
    V = 256 + NRAND + 1;   /* the last id has no bytes (a special token) */
    tp = calloc((size_t)V, sizeof *tp);
    tl = calloc((size_t)V, sizeof *tl);
    for (int i = 0; i < 256; i++) { tokb[i][0] = (char)i; tp[i] = tokb[i]; tl[i] = 1; }
    for (int i = 256; i < 256 + NRAND; i++) {
        size_t n = 0, want = 2 + rnd() % 6;
        while (n < want) {
            const char *a = alpha[rnd() % (unsigned)na];
            size_t k = strlen(a);
            if (n + k >= MAXTOK) break;
            memcpy(tokb[i] + n, a, k);
            n += k;
        }
        tp[i] = tokb[i];
        tl[i] = n;
    }
    voc = ds41_gvocab_new(V, tp, tl);
}

/* Walks `walks` random paths of up to `steps` tokens with both matchers; prefer: a byte the
 * walk takes when it can (to go deep), -1 for none. Returns the deepest output length. */
static int differ(const char *name, const char *gbnf, int walks, int steps, int prefer) {
    char err[256];
    ds41_grammar *g = ds41_grammar_gbnf(gbnf, strlen(gbnf), err, sizeof err);
    CHECK(g, "%s: %s", name, err);
    if (!g) return 0;
    ds41_gtables *t = ds41_gtables_new(g, voc, err, sizeof err);
    CHECK(t, "%s: %s", name, err);
    ds41_gmatch *oracle = ds41_gmatch_new(g, voc), *fast = ds41_gmatch_new(g, voc);
    CHECK(oracle && fast && t && ds41_gmatch_use_tables(fast, t) == 0, "%s: matchers", name);
    int words = (V + 31) / 32, longest = 0, compared = 0, bad = 0;
    if (t) ds41_gtables_stats(t, NULL, NULL, &pairs_built, NULL);
    int *allowed = malloc((size_t)V * sizeof *allowed);
    for (int w = 0; t && w < walks; w++) {
        ds41_gmatch *fresh = ds41_gmatch_new(g, voc);
        CHECK(fresh && ds41_gmatch_use_tables(fresh, t) == 0, "%s: fresh matcher", name);
        if (!fresh) break;
        int so = ds41_gmatch_start(oracle), sf = ds41_gmatch_start(fast), sn = ds41_gmatch_start(fresh), len = 0;
        for (int k = 0; k < steps && so >= 0 && sf >= 0 && sn >= 0; k++) {
            const uint32_t *mo = ds41_gmatch_mask(oracle, so);
            if (!mo) break;   /* a limit: the oracle has no mask to compare with */
            uint32_t *copy = malloc((size_t)words * sizeof *copy);
            memcpy(copy, mo, (size_t)words * sizeof *copy);
            const uint32_t *mf = ds41_gmatch_mask(fast, sf);
            CHECK(mf, "%s: tables mask failed: %s", name, ds41_gmatch_error(fast));
            if (!mf) { free(copy); break; }
            compared++;
            const uint32_t *mn = ds41_gmatch_mask(fresh, sn);
            CHECK(mn && !memcmp(copy, mn, (size_t)words * sizeof *copy), "%s: walk %d step %d: the fresh matcher's mask differs", name, w, k);
            if (memcmp(copy, mf, (size_t)words * sizeof *copy)) {
                if (bad++ < 3) {
                    int id = 0;
                    while (((copy[id >> 5] ^ mf[id >> 5]) >> (id & 31) & 1) == 0) id++;
                    CHECK(0, "%s: walk %d step %d: token %d ('%.*s') walk %d, tables %d", name, w, k, id, (int)tl[id], tp[id],
                          copy[id >> 5] >> (id & 31) & 1, mf[id >> 5] >> (id & 31) & 1);
                }
            }
            CHECK(ds41_gmatch_can_end(oracle, so) == ds41_gmatch_can_end(fast, sf), "%s: can_end differs", name);
            int na = 0, pick = -1;
            for (int id = 0; id < V; id++)
                if (copy[id >> 5] >> (id & 31) & 1) {
                    allowed[na++] = id;
                    if (prefer >= 0 && tl[id] == 1 && (unsigned char)tp[id][0] == (unsigned)prefer) pick = id;
                }
            free(copy);
            if (ds41_gmatch_can_end(oracle, so) && (na == 0 || rnd() % 6 == 0)) break;
            if (na == 0) break;
            if (pick < 0) pick = allowed[rnd() % (unsigned)na];
            so = ds41_gmatch_advance(oracle, so, pick);
            sf = ds41_gmatch_advance(fast, sf, pick);
            sn = ds41_gmatch_advance(fresh, sn, pick);
            CHECK((so >= 0) == (sf >= 0) && (so >= 0) == (sn >= 0), "%s: advance differs", name);
            len += (int)tl[pick];
        }
        if (len > longest) longest = len;
        ds41_gmatch_free(fresh);
    }
    if (t) ds41_gtables_memo_stats(t, NULL, &memo_hits, &memo_misses, &memo_masks);
    CHECK(compared >= walks, "%s: only %d masks compared", name, compared);
    free(allowed);
    ds41_gmatch_free(oracle);
    ds41_gmatch_free(fast);
    ds41_gtables_free(t);
    ds41_grammar_free(g);
    return longest;
}

static void test_schemas(void) {
    CASE_BEGIN();
    static const char *schemas[] = {
        NULL,   /* json_object */
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3},"
        "\"c\":{\"type\":\"boolean\"},\"d\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}}},\"required\":[\"b\"],"
        "\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"x\",1,null,true,\"a\\\"b\"]},\"minItems\":1,\"maxItems\":4}",
        "{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"},{\"type\":\"string\",\"format\":\"date\"},"
        "{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}}}]}",
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},"
        "{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-f]{2,4}$\"}},"
        "\"t\":{\"const\":\"\\u00e9\\u20ac\"}}}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        char err[256], name[32];
        char *gb = ds41_schema_to_gbnf(schemas[i], schemas[i] ? strlen(schemas[i]) : 0, err, sizeof err);
        CHECK(gb, "schema %zu: %s", i, err);
        snprintf(name, sizeof name, "schema %zu", i);
        if (gb) differ(name, gb, 30, 80, -1);
        if (i == 1 || i == 5) CHECK(pairs_built > 0, "%s: no pair tables (strings have them)", name);
        /* strings end inside tokens here: dependent sets were walked, and served again */
        CHECK(memo_misses > 0 && memo_hits > 0, "%s: memo %lld hits, %lld walked", name, memo_hits, memo_misses);
        CHECK(memo_masks > 0, "%s: no mask copied from the memo", name);
        free(gb);
    }
    case_end("grammar_tables_schemas");
}

static void test_regex_gbnf_choice(void) {
    CASE_BEGIN();
    static const char *res[] = { "[a-c]{2,4}x?", "(ab|abc)+[0-9]", "\\d{3}-\\d{2}", "[^a-z\\n\\x00]{1,3}", "(\xc3\xa9|\xe2\x82\xac)+ ?\\w{0,5}",
                                 "(\\\"[a-z]*\\\",)*\\\"\\\"" };
    for (size_t i = 0; i < sizeof res / sizeof res[0]; i++) {
        char err[256];
        char *gb = ds41_regex_to_gbnf(res[i], strlen(res[i]), err, sizeof err);
        CHECK(gb, "regex %s: %s", res[i], err);
        if (gb) differ(res[i], gb, 30, 40, -1);
        free(gb);
    }
    differ("arithmetic", "root ::= expr\nexpr ::= term ([-+*/] term)*\nterm ::= num | \"(\" ws expr ws \")\"\n"
                         "num ::= [0-9]+ (\".\" [0-9]+)?\nws ::= [ \\n]*\n", 30, 60, -1);
    const char *ch[] = { "yes", "no", "\"no\"", "maybe not" };
    size_t ln[] = { 3, 2, 4, 9 };
    char err[128];
    char *gb = ds41_choice_to_gbnf(ch, ln, 4, err, sizeof err);
    CHECK(gb, "choice: %s", err);
    if (gb) differ("choice", gb, 20, 10, -1);
    free(gb);
    case_end("grammar_tables_regex_gbnf_choice");
}

/* Nesting past DS41_GRAMMAR_MAX_DEPTH: the tables' depth guard hands those stacks to the walk,
 * and the deepest openings are refused by both. */
static void test_deep(void) {
    CASE_BEGIN();
    int longest = differ("deep", "root ::= \"[\" inner \"]\"\ninner ::= root | \"x\"\n", 3, 300, '[');
    CHECK(longest > DS41_GRAMMAR_MAX_DEPTH, "deepest walk %d bytes, want past the depth limit", longest);
    case_end("grammar_tables_deep");
}

int main(void) {
    make_vocab();
    CHECK(voc != NULL, "vocab");
    test_schemas();
    test_regex_gbnf_choice();
    test_deep();
    ds41_gvocab_free(voc);
    free(tp);
    free(tl);
    return check_total_failed ? 1 : 0;
}
