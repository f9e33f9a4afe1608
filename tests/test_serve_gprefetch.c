/* Grammar masks computed beside the forward (src/serve/serve_gprefetch.c): while the helper
 * prefetches the masks of states on a matcher, its owner thread goes on advancing and asking
 * for masks on the same matcher (as the sampler does when a forward ends before the helper);
 * every mask equals the one a matcher used by one thread alone gives for the same token path,
 * prefetched masks are served from the cache, and a helper stopped with work queued joins. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "serve_gprefetch.h"

enum { V = 256 + 64, STEPS = 400 };

static const char *G = "root ::= \"[\" (item (\", \" item)*)? \"]\"\n"
                       "item ::= \"{\\\"k\\\": \" num \"}\" | \"\\\"\" [a-z]* \"\\\"\"\n"
                       "num ::= \"-\"? [0-9]+\n";

static void test_beside(void) {
    CASE_BEGIN();
    /* the 256 bytes and 64 two- and three-byte tokens over the grammar's characters */
    static char b[V][4];
    const char *p[V];
    size_t l[V];
    const char *alpha = "[]{}\"k: ,-0123456789abcxyz";
    unsigned r = 11;
    for (int i = 0; i < V; i++) {
        if (i < 256) { b[i][0] = (char)i; l[i] = 1; }
        else {
            l[i] = 2 + (size_t)(i % 2);
            for (size_t k = 0; k < l[i]; k++) { r = r * 1103515245u + 12345u; b[i][k] = alpha[(r >> 8) % strlen(alpha)]; }
        }
        p[i] = b[i];
    }
    ds41_gvocab *voc = ds41_gvocab_new(V, p, l);
    char err[200];
    ds41_grammar *g = ds41_grammar_gbnf(G, strlen(G), err, sizeof err);
    CHECK(voc && g, "setup: %s", err);
    ds41_gtables *t = ds41_gtables_new(g, voc, err, sizeof err);
    ds41_gmatch *alone = ds41_gmatch_new(g, voc), *shared = ds41_gmatch_new(g, voc);
    CHECK(t && alone && shared && ds41_gmatch_use_tables(shared, t) == 0, "matchers");
    ds41_gprefetch *pf = ds41_gprefetch_start();
    CHECK(pf != NULL, "helper");
    int sa = ds41_gmatch_start(alone), ss = ds41_gmatch_start(shared), compared = 0;
    for (int step = 0; step < STEPS; step++) {
        /* the helper gets this state and the states after a few candidate tokens; the owner
         * meanwhile asks for this state's mask itself (the race the lock settles) */
        ds41_gmatch *gm[4] = { shared, shared, shared, shared };
        int st[4] = { ss, -1, -1, -1 };
        CHECK(ds41_gprefetch_submit(pf, gm, st, 1) == 1, "submit");
        const uint32_t *ms = ds41_gmatch_mask(shared, ss);
        uint32_t copy[(V + 31) / 32];
        CHECK(ms != NULL, "step %d: mask", step);
        if (ms) memcpy(copy, ms, sizeof copy);
        ds41_gprefetch_wait(pf);
        const uint32_t *ma = ds41_gmatch_mask(alone, sa);
        CHECK(ma && !memcmp(copy, ma, sizeof copy), "step %d: the shared matcher's mask differs", step);
        compared++;
        /* a token from the mask, the same for both */
        int allowed[V], na = 0;
        for (int i = 0; i < V; i++) if (copy[i >> 5] >> (i & 31) & 1) allowed[na++] = i;
        if (na == 0 || (ds41_gmatch_can_end(alone, sa) && step % 7 == 0)) {
            sa = ds41_gmatch_start(alone);
            ss = ds41_gmatch_start(shared);
            continue;
        }
        r = r * 1103515245u + 12345u;
        int id = allowed[(r >> 8) % (unsigned)na];
        sa = ds41_gmatch_advance(alone, sa, id);
        ss = ds41_gmatch_advance(shared, ss, id);
        CHECK(sa >= 0 && ss >= 0, "step %d: token %d refused", step, id);
        /* the next state's mask prefetched, then asked for: a cache hit */
        st[0] = ss;
        long long c0, c1;
        ds41_gmatch_stats(shared, NULL, NULL, &c0);
        CHECK(ds41_gprefetch_submit(pf, gm, st, 1) == 1, "submit");
        ds41_gprefetch_wait(pf);
        CHECK(ds41_gmatch_mask(shared, ss) != NULL, "step %d: mask after prefetch", step);
        ds41_gmatch_stats(shared, NULL, NULL, &c1);
        CHECK(c1 == c0 + 1, "step %d: the prefetched mask was not cached", step);
    }
    CHECK(compared == STEPS && ds41_gprefetch_count(pf) > 0, "compared %d, prefetched %lld", compared, ds41_gprefetch_count(pf));
    /* stopping with work queued joins the helper */
    int many[4] = { ss, ss, ss, ss };
    ds41_gmatch *gm4[4] = { shared, shared, shared, shared };
    ds41_gprefetch_submit(pf, gm4, many, 4);
    ds41_gprefetch_stop(pf);
    ds41_gmatch_free(alone);
    ds41_gmatch_free(shared);
    ds41_gtables_free(t);
    ds41_grammar_free(g);
    ds41_gvocab_free(voc);
    case_end("serve_gprefetch_beside");
}

int main(void) {
    test_beside();
    return check_total_failed ? 1 : 0;
}
