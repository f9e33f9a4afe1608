/* Grammar mask cost per token (issue 25): one thread, the demo tokenizer's vocabulary and a
 * synthetic one of 129,280 entries (the production size: the demo's plain tokens plus
 * concatenations of two or three of them, so the byte statistics stay BPE-like).
 *   build/bench/bench_grammar -m models/demo [--tokens N] [--vocab N] [--cpu] [--only GRAMMAR]
 *                             [--masks walk|tables|prefetch]
 * A generation is simulated: from the start state, a token is drawn from the mask (seeded
 * LCG) and advanced, until the grammar may end (then a new document starts) or N tokens. Per
 * token the time of ds41_gmatch_mask + applying it to a logits row (what ds41_lproc_apply adds
 * for a grammar) + ds41_gmatch_advance is recorded.
 *   fresh:  a new matcher per document (what one request pays: nothing cached in its
 *           matcher at its start; with tables, the masks and dependent sets earlier
 *           documents' matchers computed are in the tables' memo, as the server's requests
 *           with the same grammar share them through the table cache)
 *   warm:   one matcher for all documents (states and masks cached, as later tokens of a
 *           long request see)
 * Each run starts with tables of its own (an empty memo: the grammar's first request).
 * and two ways of computing a mask not cached:
 *   walk:   the trie walked against the state (ds41_gmatch_mask alone)
 *   tables: the grammar's precomputed token classes (ds41_gtables, built once per grammar
 *           and shared by every matcher; its build time and size are printed too)
 *   tables+prefetch: as the server runs them: the mask computed before the timing
 *           (ds41_gmatch_prefetch, which the server's helper thread runs while the step's
 *           forward does), so the time is what stays on the critical path: the cached mask,
 *           applying it and advancing
 * Prints one JSON line per (vocabulary, grammar, mode, masks) with p50 / p99 / max in
 * microseconds, the masks computed, cached in the matcher and copied from the memo. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar.h"
#include "tokenizer.h"

/* --cpu: the thread's CPU time instead of the wall clock, so that on a shared machine the time
 * the thread was preempted does not count (the cost on one core). */
static clockid_t clk = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static unsigned long long lcg = 88172645463325252ull;
static unsigned rnd(void) { lcg = lcg * 6364136223846793005ull + 1442695040888963407ull; return (unsigned)(lcg >> 33); }

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},"
    "\"maxItems\":5},\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\","
    "\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"city\"]},\"status\":{\"enum\":[\"active\",\"inactive\",\"banned\"]},"
    "\"score\":{\"type\":\"number\"}},\"required\":[\"name\",\"age\",\"status\"],\"additionalProperties\":false}";

static ds41_gmatch *matcher(const ds41_grammar *g, ds41_gvocab *gv, const ds41_gtables *tab) {
    ds41_gmatch *m = ds41_gmatch_new(g, gv);
    if (!m || (tab && ds41_gmatch_use_tables(m, tab))) { fprintf(stderr, "bench_grammar: out of memory\n"); exit(1); }
    return m;
}

static void run(const char *vname, ds41_gvocab *gv, int V, const char *gname, const ds41_grammar *g, const ds41_gtables *tab,
                int ntok, int fresh, int pre) {
    lcg = 88172645463325252ull;   /* the same walk with and without the tables */
    double *t = malloc((size_t)ntok * sizeof *t);
    float *row = malloc((size_t)V * sizeof *row);
    int *allowed = malloc((size_t)V * sizeof *allowed);
    ds41_gmatch *m = matcher(g, gv, tab);
    int s = ds41_gmatch_start(m), docs = 1, n = 0, doc_len = 0;
    long long computed = 0, cached = 0, states = 0;
    while (n < ntok) {
        for (int i = 0; i < V; i++) row[i] = 0.0f;
        if (pre) ds41_gmatch_prefetch(m, s);   /* the server's helper, while the forward runs: not timed */
        double t0 = now();
        const uint32_t *mk = ds41_gmatch_mask(m, s);
        if (!mk) { fprintf(stderr, "bench_grammar: %s\n", ds41_gmatch_error(m)); exit(1); }
        ds41_gmask_apply(mk, row, V);
        double t1 = now();
        int na = 0;
        for (int i = 0; i < V; i++) if (row[i] == 0.0f) allowed[na++] = i;
        int end = ds41_gmatch_can_end(m, s) && (na == 0 || rnd() % 8 == 0 || doc_len > 400);
        if (end || na == 0) {
            t[n++] = t1 - t0;
            long long st, c1, c2;
            ds41_gmatch_stats(m, &st, &c1, &c2);
            if (fresh) {
                computed += c1; cached += c2; states += st;
                ds41_gmatch_free(m);
                m = matcher(g, gv, tab);
            }
            s = ds41_gmatch_start(m);
            docs++;
            doc_len = 0;
            continue;
        }
        int id = allowed[rnd() % (unsigned)na];
        double t2 = now();
        s = ds41_gmatch_advance(m, s, id);
        double t3 = now();
        t[n++] = (t1 - t0) + (t3 - t2);
        doc_len++;
        if (s < 0) { fprintf(stderr, "bench_grammar: a masked token was refused\n"); exit(1); }
    }
    long long st, c1, c2;
    ds41_gmatch_stats(m, &st, &c1, &c2);
    computed += c1; cached += c2; states += st;
    qsort(t, (size_t)n, sizeof *t, cmpd);
    long long shared = 0;
    size_t memo_bytes = 0;
    if (tab) ds41_gtables_memo_stats(tab, &memo_bytes, NULL, NULL, &shared);
    printf("{\"vocab\":\"%s\",\"V\":%d,\"grammar\":\"%s\",\"mode\":\"%s\",\"masks\":\"%s%s\",\"tokens\":%d,\"docs\":%d,\"p50_us\":%.2f,"
           "\"p90_us\":%.2f,\"p99_us\":%.2f,\"max_us\":%.1f,\"masks_computed\":%lld,\"masks_cached\":%lld,\"masks_from_memo\":%lld,"
           "\"memo_bytes\":%zu,\"states\":%lld}\n",
           vname, V, gname, fresh ? "fresh" : "warm", tab ? "tables" : "walk", pre ? "+prefetch" : "", n, docs, 1e6 * t[n / 2], 1e6 * t[n * 9 / 10], 1e6 * t[n * 99 / 100],
           1e6 * t[n - 1], computed, cached, shared, memo_bytes, states);
    fflush(stdout);
    ds41_gmatch_free(m);
    free(t); free(row); free(allowed);
}

/* --only G: that grammar alone; --masks K: walk, tables or prefetch alone (for profiles). */
static const char *only, *only_masks;

static ds41_gtables *tables(const ds41_grammar *g, ds41_gvocab *gv, double *ms) {
    char err[256];
    double t0 = now();
    ds41_gtables *tab = ds41_gtables_new(g, gv, err, sizeof err);
    if (ms) *ms = 1e3 * (now() - t0);
    if (!tab) { fprintf(stderr, "bench_grammar: %s\n", err); exit(1); }
    return tab;
}

/* One grammar on one vocabulary: the tables' build, then the runs, each with tables of its own
 * (their memo starts empty, as for a grammar the server has not seen). */
static void bench(const char *vname, ds41_gvocab *gv, int V, const char *gname, const char *gbnf, int ntok) {
    if (only && strcmp(only, gname)) return;
    char err[256];
    ds41_grammar *g = ds41_grammar_gbnf(gbnf, strlen(gbnf), err, sizeof err);
    if (!g) { fprintf(stderr, "bench_grammar: %s\n", err); exit(1); }
    double ms;
    ds41_gtables *tab = tables(g, gv, &ms);
    size_t bytes;
    int npos, pairs, skipped;
    ds41_gtables_stats(tab, &bytes, &npos, &pairs, &skipped);
    printf("{\"vocab\":\"%s\",\"V\":%d,\"grammar\":\"%s\",\"tables_ms\":%.1f,\"tables_bytes\":%zu,\"positions\":%d,\"pairs\":%d,"
           "\"skipped\":%d}\n", vname, V, gname, ms, bytes, npos, pairs, skipped);
    ds41_gtables_free(tab);
    for (int fresh = 1; fresh >= 0; fresh--)
        for (int kind = 0; kind < 3; kind++) {
            static const char *kinds[3] = { "walk", "tables", "prefetch" };
            if (only_masks && strcmp(only_masks, kinds[kind])) continue;
            tab = kind ? tables(g, gv, NULL) : NULL;
            run(vname, gv, V, gname, g, tab, ntok, fresh, kind == 2);
            ds41_gtables_free(tab);
        }
    ds41_grammar_free(g);
}

int main(int argc, char **argv) {
    const char *model = NULL;
    int ntok = 4000, bigV = 129280;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) ntok = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) bigV = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu")) clk = CLOCK_THREAD_CPUTIME_ID;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--masks") && i + 1 < argc) only_masks = argv[++i];
        else { fprintf(stderr, "usage: bench_grammar -m DIR [--tokens N] [--vocab N] [--cpu] [--only GRAMMAR] [--masks walk|tables|prefetch]\n"); return 2; }
    }
    if (!model || ntok < 100 || bigV < 4096) { fprintf(stderr, "usage: bench_grammar -m DIR [--tokens N] [--vocab N] [--cpu] [--only GRAMMAR] [--masks walk|tables|prefetch]\n"); return 2; }
    ds41_tokenizer *tok;
    ds41_err e;
    if (ds41_tokenizer_load(model, &tok, &e)) { fprintf(stderr, "bench_grammar: %s\n", e.msg); return 1; }
    int V0 = ds41_tokenizer_vocab_size(tok);
    const char **p = calloc((size_t)bigV, sizeof *p);
    size_t *l = calloc((size_t)bigV, sizeof *l);
    int *plain = malloc((size_t)V0 * sizeof *plain), np = 0;
    for (int i = 0; i < V0; i++) if (ds41_token_plain_bytes(tok, i, &p[i], &l[i]) && l[i]) plain[np++] = i;
    ds41_gvocab *small = ds41_gvocab_new(V0, p, l);
    /* the synthetic entries: two or three plain tokens joined */
    char *arena = malloc((size_t)bigV * 48);
    size_t ao = 0;
    for (int i = V0; i < bigV; i++) {
        int k = 2 + (int)(rnd() % 2);
        p[i] = arena + ao;
        size_t len = 0;
        for (int j = 0; j < k; j++) {
            int id = plain[rnd() % (unsigned)np];
            if (len + l[id] > 40) break;
            memcpy(arena + ao + len, p[id], l[id]);
            len += l[id];
        }
        l[i] = len;
        ao += len;
    }
    ds41_gvocab *big = ds41_gvocab_new(bigV, p, l);
    char err[256];
    char *js = ds41_schema_to_gbnf(SCHEMA, strlen(SCHEMA), err, sizeof err);
    char *jo = ds41_schema_to_gbnf(NULL, 0, err, sizeof err);
    const char *rx = "[a-z]{3,8}-[0-9]{4}( [A-Z][a-z]{2,10}){0,3}";
    char *re = ds41_regex_to_gbnf(rx, strlen(rx), err, sizeof err);
    /* a recursive GBNF grammar: arithmetic over numbers, names and calls */
    const char *gb = "root ::= expr\n"
                     "expr ::= term ([+-] term)*\n"
                     "term ::= factor ([*/] factor)*\n"
                     "factor ::= num | name (\"(\" expr (\", \" expr)* \")\")? | \"(\" expr \")\"\n"
                     "num ::= [0-9]+ (\".\" [0-9]+)?\n"
                     "name ::= [a-z_] [a-z0-9_]*\n";
    if (!js || !jo || !re || !small || !big) { fprintf(stderr, "bench_grammar: setup failed\n"); return 1; }
    bench("demo", small, V0, "json_schema", js, ntok);
    bench("demo", small, V0, "json_object", jo, ntok);
    bench("demo", small, V0, "regex", re, ntok);
    bench("demo", small, V0, "gbnf", gb, ntok);
    bench("synthetic", big, bigV, "json_schema", js, ntok);
    bench("synthetic", big, bigV, "json_object", jo, ntok);
    bench("synthetic", big, bigV, "regex", re, ntok);
    bench("synthetic", big, bigV, "gbnf", gb, ntok);
    free(js); free(jo); free(re); free(arena); free(p); free(l); free(plain);
    ds41_gvocab_free(small);
    ds41_gvocab_free(big);
    ds41_tokenizer_free(tok);
    return 0;
}
