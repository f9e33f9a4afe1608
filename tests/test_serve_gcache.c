/* The server's grammar table cache (src/serve/serve_gcache.c): the same GBNF text builds its
 * tables once and later lookups share the entry (and free the grammar they bring); the
 * entry's tables give the trie walk's masks; unheld entries go when the byte bound is passed,
 * least recently used first, held ones never; eight threads asking for one new grammar at once
 * build it once; with every slot held, a new grammar is built for its request and freed with
 * it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "serve_gcache.h"

static ds41_gvocab *voc;

static ds41_grammar *compile(const char *text) {
    char err[200];
    ds41_grammar *g = ds41_grammar_gbnf(text, strlen(text), err, sizeof err);
    CHECK(g, "compile %s: %s", text, err);
    return g;
}

static ds41_gentry *get(ds41_gcache *c, const char *text) {
    ds41_grammar *g = compile(text);
    ds41_gentry *e = ds41_gcache_get(c, text, strlen(text), &g);
    CHECK(e && !g, "get %s: entry %p, grammar left %p", text, (void *)e, (void *)g);
    return e;
}

static ds41_gcache_stats stats(ds41_gcache *c) {
    ds41_gcache_stats s;
    ds41_gcache_get_stats(c, &s);
    return s;
}

/* A grammar of one shape per letter: equal table sizes. */
static const char *text_of(char *buf, char letter) {
    sprintf(buf, "root ::= \"%c\" [0-9]* (\",\" [a-z]+)?\n", letter);
    return buf;
}

static void test_share_and_masks(void) {
    CASE_BEGIN();
    ds41_gcache *c = ds41_gcache_new(voc, (size_t)1 << 30);
    char ta[64], tb[64];
    ds41_gentry *a1 = get(c, text_of(ta, 'a'));
    ds41_gcache_stats s = stats(c);
    CHECK(s.builds == 1 && s.hits == 0 && s.entries == 1 && s.bytes > 0, "first: builds %lld hits %lld entries %lld bytes %lld",
          s.builds, s.hits, s.entries, s.bytes);
    ds41_gentry *a2 = get(c, ta);
    s = stats(c);
    CHECK(a2 == a1 && s.builds == 1 && s.hits == 1, "second: same entry %d, builds %lld hits %lld", a2 == a1, s.builds, s.hits);
    ds41_gentry *b = get(c, text_of(tb, 'b'));
    s = stats(c);
    CHECK(b != a1 && s.builds == 2 && s.entries == 2, "another grammar: builds %lld entries %lld", s.builds, s.entries);
    long long before = s.bytes;
    /* the entry's tables give the walk's mask, at the start and after "a1" */
    ds41_gmatch *walk = ds41_gmatch_new(ds41_gentry_grammar(a1), voc), *tab = ds41_gmatch_new(ds41_gentry_grammar(a1), voc);
    CHECK(walk && tab && ds41_gentry_tables(a1) && ds41_gmatch_use_tables(tab, ds41_gentry_tables(a1)) == 0, "matchers");
    int sw = ds41_gmatch_start(walk), st = ds41_gmatch_start(tab);
    for (int k = 0; k < 3; k++) {
        const uint32_t *mw = ds41_gmatch_mask(walk, sw), *mt = ds41_gmatch_mask(tab, st);
        CHECK(mw && mt && !memcmp(mw, mt, 256 / 8), "step %d: masks differ", k);
        int id = k == 0 ? 'a' : k == 1 ? '1' : ',';
        sw = ds41_gmatch_advance(walk, sw, id);
        st = ds41_gmatch_advance(tab, st, id);
        CHECK(sw >= 0 && st >= 0, "step %d: refused", k);
    }
    ds41_gmatch_free(walk);
    ds41_gmatch_free(tab);
    ds41_gentry_release(a1);
    ds41_gentry_release(a2);
    ds41_gentry_release(b);
    s = stats(c);
    CHECK(s.entries == 2, "released entries stay cached under the bound: %lld", s.entries);
    /* the three masks went into a1's memo (grammar_memo.c), counted at the release */
    CHECK(s.bytes > before, "the memo's bytes are counted: %lld, %lld before", s.bytes, before);
    ds41_gcache_free(c);
    case_end("serve_gcache_share");
}

static void test_evict(void) {
    CASE_BEGIN();
    char ta[64], tb[64], tc[64];
    /* the size of one entry, then a cache that holds two */
    ds41_gcache *c0 = ds41_gcache_new(voc, (size_t)1 << 30);
    ds41_gentry_release(get(c0, text_of(ta, 'a')));
    size_t one = (size_t)stats(c0).bytes;
    ds41_gcache_free(c0);
    ds41_gcache *c = ds41_gcache_new(voc, 2 * one);
    ds41_gentry_release(get(c, text_of(ta, 'a')));
    ds41_gentry_release(get(c, text_of(tb, 'b')));
    ds41_gentry_release(get(c, ta));                   /* a: used last */
    ds41_gentry_release(get(c, text_of(tc, 'c')));     /* over the bound: b goes */
    ds41_gcache_stats s = stats(c);
    CHECK(s.builds == 3 && s.hits == 1 && s.entries == 2 && (size_t)s.bytes == 2 * one,
          "after c: builds %lld hits %lld entries %lld bytes %lld (one %zu)", s.builds, s.hits, s.entries, s.bytes, one);
    ds41_gentry_release(get(c, ta));
    CHECK(stats(c).builds == 3, "a was kept (used more recently than b)");
    ds41_gentry_release(get(c, tb));
    CHECK(stats(c).builds == 4, "b was evicted: built again");
    ds41_gcache_free(c);
    /* a bound of 0: held entries stay, each goes at its release */
    c = ds41_gcache_new(voc, 0);
    ds41_gentry *a = get(c, ta), *b = get(c, tb);
    CHECK(stats(c).entries == 2, "held entries are not evicted: %lld", stats(c).entries);
    ds41_gentry_release(b);
    CHECK(stats(c).entries == 1, "b released: %lld left", stats(c).entries);
    ds41_gentry_release(a);
    s = stats(c);
    CHECK(s.entries == 0 && s.bytes == 0, "all released: entries %lld bytes %lld", s.entries, s.bytes);
    ds41_gcache_free(c);
    case_end("serve_gcache_evict");
}

typedef struct { ds41_gcache *c; const char *text; ds41_gentry *e; } racer;

static void *race(void *arg) {
    racer *r = arg;
    ds41_grammar *g = compile(r->text);
    r->e = ds41_gcache_get(r->c, r->text, strlen(r->text), &g);
    return NULL;
}

static void test_threads_and_full(void) {
    CASE_BEGIN();
    ds41_gcache *c = ds41_gcache_new(voc, (size_t)1 << 30);
    char td[64];
    racer r[8];
    pthread_t th[8];
    text_of(td, 'd');
    for (int i = 0; i < 8; i++) {
        r[i] = (racer){ c, td, NULL };
        CHECK(pthread_create(&th[i], NULL, race, &r[i]) == 0, "thread %d", i);
    }
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    ds41_gcache_stats s = stats(c);
    int same = 1;
    for (int i = 0; i < 8; i++) same &= r[i].e == r[0].e && r[i].e;
    CHECK(same && s.builds == 1 && s.hits == 7, "8 threads: same entry %d, builds %lld hits %lld", same, s.builds, s.hits);
    for (int i = 0; i < 8; i++) ds41_gentry_release(r[i].e);
    ds41_gcache_free(c);
    /* every slot held: one more grammar is built for its request, not cached */
    c = ds41_gcache_new(voc, (size_t)1 << 30);
    ds41_gentry *held[DS41_GCACHE_ENTRIES];
    char t[DS41_GCACHE_ENTRIES][48], extra[] = "root ::= \"extra\"\n";
    for (int i = 0; i < DS41_GCACHE_ENTRIES; i++) {
        sprintf(t[i], "root ::= \"g%d\" [0-9]*\n", i);
        held[i] = get(c, t[i]);
    }
    ds41_gentry *x = get(c, extra);
    s = stats(c);
    CHECK(x && ds41_gentry_tables(x) && s.entries == DS41_GCACHE_ENTRIES && s.builds == DS41_GCACHE_ENTRIES + 1,
          "full: entries %lld builds %lld", s.entries, s.builds);
    ds41_gentry_release(x);
    ds41_gentry_release(get(c, extra));
    CHECK(stats(c).builds == DS41_GCACHE_ENTRIES + 2, "the uncached grammar is built again: %lld", stats(c).builds);
    ds41_gentry_release(held[0]);
    ds41_gentry_release(get(c, extra));   /* a free slot now: the least recent unheld entry gives way */
    ds41_gentry_release(get(c, extra));
    s = stats(c);
    CHECK(s.builds == DS41_GCACHE_ENTRIES + 3 && s.entries == DS41_GCACHE_ENTRIES, "after a release: builds %lld entries %lld",
          s.builds, s.entries);
    for (int i = 1; i < DS41_GCACHE_ENTRIES; i++) ds41_gentry_release(held[i]);
    ds41_gcache_free(c);
    case_end("serve_gcache_threads_full");
}

int main(void) {
    const char *p[256];
    size_t l[256];
    static char b[256];
    for (int i = 0; i < 256; i++) { b[i] = (char)i; p[i] = b + i; l[i] = 1; }
    voc = ds41_gvocab_new(256, p, l);
    CHECK(voc != NULL, "vocab");
    test_share_and_masks();
    test_evict();
    test_threads_and_full();
    ds41_gvocab_free(voc);
    return check_total_failed ? 1 : 0;
}
