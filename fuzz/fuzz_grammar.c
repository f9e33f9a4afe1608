/* libFuzzer harness for the GBNF compiler and the grammar runtime (src/text/grammar.c,
 * grammar_match.c): each input is GBNF text. A refusal must come with a one-line message; an
 * accepted grammar is walked over a small byte vocabulary (the 256 bytes and a few longer
 * tokens): every mask must agree with advance on every token, the mask from the precomputed
 * token classes (grammar_tables.c) must equal the trie walk's wherever the walk has one (the
 * walk is run twice, the second time with new matchers over the tables' memo of dependent sets
 * that the first filled, grammar_memo.c), and the limits must end every walk (no hang, no
 * unbounded memory). */
#include "grammar.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ds41_gvocab *voc;
enum { NV = 256 + 6 };
static const char *tp[NV];
static size_t tl[NV];
static char bytes[256];

static void vocab(void) {
    static const char *more[6] = { "ab", "\"}", "{\"", "12", "\xc3\xa9", "  " };
    for (int i = 0; i < 256; i++) { bytes[i] = (char)i; tp[i] = &bytes[i]; tl[i] = 1; }
    for (int i = 0; i < 6; i++) { tp[256 + i] = more[i]; tl[256 + i] = strlen(more[i]); }
    voc = ds41_gvocab_new(NV, tp, tl);
}

/* One walk of up to 12 tokens with a matcher by the trie walk and one by the tables. */
static void walk(const ds41_grammar *g, const ds41_gtables *t, unsigned pick) {
    ds41_gmatch *m = ds41_gmatch_new(g, voc), *f = ds41_gmatch_new(g, voc);
    if (!m || !f || ds41_gmatch_use_tables(f, t)) abort();
    int s = ds41_gmatch_start(m), sf = ds41_gmatch_start(f);
    for (int step = 0; step < 12 && s >= 0; step++) {
        const uint32_t *mk = ds41_gmatch_mask(m, s);
        if (!mk) break;   /* a limit: the message is set */
        /* the tables may give a mask where the walk hit a limit (they intern fewer states),
         * never another one */
        const uint32_t *mf = sf >= 0 ? ds41_gmatch_mask(f, sf) : NULL;
        if (mf && memcmp(mk, mf, (NV + 31) / 32 * sizeof *mk)) abort();
        int na = 0, chosen = -1;
        for (int id = 0; id < NV; id++) {
            int bit = (mk[id >> 5] >> (id & 31)) & 1;
            if (bit != (ds41_gmatch_advance(m, s, id) >= 0)) abort();
            if (bit && (na++ == 0 || pick % (unsigned)na == 0)) chosen = id;
        }
        if (chosen < 0) break;
        pick = pick * 1103515245u + 12345u;
        s = ds41_gmatch_advance(m, s, chosen);
        if (sf >= 0) sf = ds41_gmatch_advance(f, sf, chosen);
    }
    ds41_gmatch_free(m);
    ds41_gmatch_free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!voc) vocab();
    char err[256] = "";
    ds41_grammar *g = ds41_grammar_gbnf((const char *)data, size, err, sizeof err);
    if (!g) {
        if (!err[0]) abort();
        for (const char *p = err; *p; p++) if ((unsigned char)*p < 0x20) abort();
        return 0;
    }
    ds41_gtables *t = ds41_gtables_new(g, voc, err, sizeof err);
    if (!t) abort();
    walk(g, t, (unsigned)size);
    walk(g, t, (unsigned)size);
    ds41_gtables_free(t);
    ds41_grammar_free(g);
    return 0;
}
