/* ds41 grammar: precomputed token classes per grammar position (grammar.h, ds41_gtables).
 *
 * Why it is exact. A state is a set of stacks and advancing maps each stack on its own (the
 * state after a byte is the union of what each stack becomes), so a token is allowed after a
 * state when it is allowed after one of its stacks. Take one stack [below..., p] with top
 * position p. Matching a token from it does exactly what matching it from the lone stack [p]
 * does, with `below` under every stack, until the lone run pops past the end of p's
 * alternative (its stack empties): only then does `below` take part. So the lone run from [p]
 * over the trie sorts every token once per grammar:
 *   accepted   a path ends the token with a non-empty lone stack: allowed whatever is below;
 *   refused    every path dies before the token ends and none popped: refused whatever is below;
 *   dependent  a path popped at trie node i (after its j bytes): the token is allowed when
 *              the state of `below` accepts the rest of it, for one such node. The build keeps
 *              the pop nodes; a mask walks each pop node's subtree from the state of `below`
 *              (the trie walk of grammar_match.c, over that subtree only), so the dependent
 *              tokens that share bytes share the work and a refused byte skips its subtree.
 * The one thing `below` changes in the lone part is the depth limit (a push deeper than
 * DS41_GRAMMAR_MAX_DEPTH is dropped): the build records the longest stack each position's run
 * pushed, and a stack too deep for that guard is left to the trie walk (grammar_match.c), as
 * is a position the build did not finish (its budget or a limit).
 *
 * Memory: an accepted set is a list of ids when it is shorter than a bitset, a bitset
 * otherwise, and the pop nodes a list. */
#define _GNU_SOURCE  /* qsort_r */
#include "grammar_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Trie nodes visited over all positions before the rest are left to the walk: a hostile
 * grammar (400,000 positions) must not take minutes to build or gigabytes to hold: 2^28 visits
 * took about 1 s on one core at 129,280 entries (3,000 rules of a negated class each). */
enum { BUILD_BUDGET = 1 << 28, TABLE_BYTES = 64 << 20, LOCAL_STATES = 8000 };
/* A position with more pop nodes than PAIR_POPS or a 64th of the trie (a string's characters, which may end after
 * any byte), or whose pop nodes' subtrees hold more than a PAIR_SUB-th of the trie (an escape
 * inside a string: few pop nodes, but the string goes on under them), also gets one table per
 * element that can lie under it (at most PAIR_BELOW of them): the run from [below, p] pops
 * only where that element's alternative ends (after the closing quote), so a mask walks few
 * pop nodes. PAIR_SUB 4096 against none, bench_grammar's schema at 129,280 entries: the
 * masks it computed spent 3.7 times fewer cycles walking (136 to 36 million over a run) for
 * 19% more table bytes (6.6 to 7.8 MB). */
enum { PAIR_POPS = 256, PAIR_BELOW = 64, PAIR_SUB = 4096, FOLLOW_PASSES = 200 };

typedef struct {
    int32_t lmax;          /* longest lone stack pushed; -1: not precomputed (walk the trie) */
    int32_t acc_bits;      /* 1: the accepted set is a bitset at bits + acc; 0: acc_n ids at ids + acc */
    size_t acc, acc_n;
    int32_t end_bits;      /* the tokens that end where the run pops: allowed when the stack below survives */
    size_t end, end_n;
    size_t pop, pop_n;     /* pop_n trie nodes at pops + pop: children of pop nodes, by a byte in the follow set */
    int32_t below;         /* a pair's element under the top; -1 for a lone position */
    int32_t pair, pair_n;  /* a position's pairs at pos + pair */
} gpos;

struct ds41_gtables {
    const ds41_grammar *g;
    const ds41_gvocab *v;
    int words;
    int32_t *pos_ix;       /* per element: its index in pos[], -1 unless a byte set */
    gpos *pos;
    int n_pos, n_pairs, n_skipped;
    uint32_t *bits;
    int32_t *ids, *pops;
    uint32_t *follow;      /* building: per rule, the bytes that can follow it (8 words) */
    int32_t *elrule;       /* building: each element's rule */
    size_t nbits, cbits, nids, cids, npops, cpops;
    ds41_gdep *memo;       /* the dependent sets walked so far (grammar_memo.c) */
};

static int grow(void *pp, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    void *q = realloc(*(void **)pp, nc * elem);
    if (!q) return -1;
    *(void **)pp = q;
    *cap = nc;
    return 0;
}

/* A matcher for the lone runs: it records the stack depth each transition pushed. */
static ds41_gmatch *lone_new(const ds41_grammar *g, const ds41_gvocab *v) {
    ds41_gmatch *m = ds41_gmatch_new(g, v);
    if (!m) return NULL;
    m->track_depth = 1;
    m->tdep = calloc((size_t)m->scap, sizeof *m->tdep);
    if (!m->tdep) { ds41_gmatch_free(m); return NULL; }
    return m;
}

/* Stores the token set acc (n tokens; zeroed afterwards) as a list or a bitset: 0, or -1. */
static int store_set(ds41_gtables *t, uint32_t *acc, size_t n, int32_t *kind, size_t *at) {
    if (n < (size_t)t->words) {
        if (grow(&t->ids, &t->cids, t->nids + n, sizeof *t->ids)) return -1;
        *kind = 0;
        *at = t->nids;
        for (int w = 0; w < t->words; w++)
            for (uint32_t x = acc[w]; x; x &= x - 1) t->ids[t->nids++] = w * 32 + __builtin_ctz(x);
    } else {
        if (grow(&t->bits, &t->cbits, t->nbits + (size_t)t->words, sizeof *t->bits)) return -1;
        *kind = 1;
        *at = t->nbits;
        memcpy(t->bits + t->nbits, acc, (size_t)t->words * sizeof *acc);
        t->nbits += (size_t)t->words;
    }
    memset(acc, 0, (size_t)t->words * sizeof *acc);
    return 0;
}

/* ORs a stored token set into mk. */
static void or_set(const ds41_gtables *t, int kind, size_t at, size_t n, uint32_t *mk) {
    if (kind) {
        const uint32_t *b = t->bits + at;
        for (int w = 0; w < t->words; w++) mk[w] |= b[w];
    } else if (n) {
        const int32_t *ids = t->ids + at;
        for (size_t j = 0; j < n; j++) mk[ids[j] >> 5] |= 1u << (ids[j] & 31);
    }
}

/* The lone run of stack st[0..n) (a position, or a pair) over the trie into P. F: the bytes
 * that can follow a pop (the follow set of the rule the run's bottom is in): a pop node's
 * child by another byte cannot pass the stack below. acc, endb: zeroed bitsets of t->words;
 * dst: one int per trie depth. 0, 1 when a limit ended it (the table is left to the walk), -1
 * out of memory. *visits counts the trie nodes. */
static int build_pos(ds41_gtables *t, ds41_gmatch *lm, const int32_t *st, int n, const uint32_t *F, gpos *P, uint32_t *acc,
                     uint32_t *endb, int32_t *dst, long long *visits) {
    const ds41_gvocab *v = t->v;
    int s0 = ds41_gm_stack_state(lm, st, n);
    if (s0 < 0) return 1;
    int lmax = n;
    size_t nacc = 0, nend = 0, pop0 = t->npops;
    dst[0] = s0;
    for (int i = 0; i < v->n_nodes;) {
        ++*visits;
        int d = v->depth[i], ps = dst[d - 1];
        unsigned b = v->byte[i];
        const int32_t *tr = lm->trans[ps];
        int st = tr && tr[b] != -2 ? tr[b] : ds41_gm_step(lm, ps, b);
        if (st < 0 && lm->err[0]) return 1;
        if (lm->tdep[ps][b] > lmax) lmax = lm->tdep[ps][b];
        if (st < 0) { i = v->end[i]; continue; }
        dst[d] = st;
        int alive = lm->arena[lm->soff[st]] > lm->acc[st];   /* a non-empty lone stack */
        if (lm->acc[st])   /* a lone stack emptied: what follows depends on the stack below */
            for (int c = i + 1; c < v->end[i]; c = v->end[c]) {
                ++*visits;
                if (!gcs_has(F, v->byte[c])) continue;
                if (grow(&t->pops, &t->cpops, t->npops + 1, sizeof *t->pops)) return -1;
                t->pops[t->npops++] = c;
            }
        for (int k = 0, nt = v->ntok[i]; k < nt; k++) {
            int id = v->toks[v->tok0[i] + k];
            if (alive) { acc[id >> 5] |= 1u << (id & 31); nacc++; }
            else { endb[id >> 5] |= 1u << (id & 31); nend++; }
        }
        i++;
    }
    if (store_set(t, acc, nacc, &P->acc_bits, &P->acc) || store_set(t, endb, nend, &P->end_bits, &P->end)) return -1;
    P->acc_n = nacc;
    P->end_n = nend;
    P->pop = pop0;
    P->pop_n = t->npops - pop0;
    P->lmax = lmax;
    return 0;
}

/* Builds pos[ix] from stack st[0..n): 0 (a limit or the budget leaves it to the walk), -1 out
 * of memory. */
static int build_one(ds41_gtables *t, ds41_gmatch **lm, const int32_t *st, int n, int ix, uint32_t *acc, int32_t *dst,
                     long long *visits) {
    uint32_t *endb = acc + t->words;
    const uint32_t *F = t->follow + (size_t)t->elrule[st[0]] * 8;
    gpos *P = &t->pos[ix];
    P->lmax = -1;
    if (*visits > BUILD_BUDGET || (t->nbits + t->nids + t->npops) * sizeof(int32_t) > TABLE_BYTES) {
        t->n_skipped++;
        return 0;
    }
    /* a fresh lone matcher after a limit, or when its states pile up */
    if (*lm && ((*lm)->err[0] || (*lm)->ns > LOCAL_STATES)) { ds41_gmatch_free(*lm); *lm = NULL; }
    if (!*lm && !(*lm = lone_new(t->g, t->v))) return -1;
    memset(acc, 0, 2 * (size_t)t->words * sizeof *acc);
    size_t npops = t->npops, nids = t->nids, nbits = t->nbits;
    int rc = build_pos(t, *lm, st, n, F, P, acc, endb, dst, visits);
    if (rc < 0) return -1;
    if (rc > 0) { P->lmax = -1; t->npops = npops; t->nids = nids; t->nbits = nbits; t->n_skipped++; }
    return 0;
}

/* The elements that can lie directly under a top in rule r, into out (at most PAIR_BELOW):
 * the continuation of every reference to r, and through a reference that ends its
 * alternative (the continuation is then the caller's), what lies under the caller. -1 when
 * there are more. refs: per rule, the reference
 * elements to it (ref0[r] .. ref0[r + 1]); elrule: each element's rule; mark: per rule. */
static int below_set(const ds41_grammar *g, int r, const int32_t *ref0, const int32_t *refs, const int32_t *elrule,
                     int32_t *mark, int stamp, int32_t *work, int32_t *out) {
    int nw = 0, n = 0;
    work[nw++] = r;
    mark[r] = stamp;
    while (nw) {
        int x = work[--nw];   /* under root's own alternatives is the bottom: a stack of one, no pair */
        for (int k = ref0[x]; k < ref0[x + 1]; k++) {
            int e = refs[k];
            if (g->el[e + 1].kind != GE_END) {
                int dup = 0;
                for (int j = 0; j < n && !dup; j++) dup = out[j] == e + 1;
                if (dup) continue;
                if (n == PAIR_BELOW) return -1;
                out[n++] = e + 1;
            } else if (mark[elrule[e]] != stamp) {
                mark[elrule[e]] = stamp;
                work[nw++] = elrule[e];
            }
        }
    }
    return n;
}

/* The bytes a sequence el[e..] can start with into f (8 words, OR-ed); whether it can be empty. */
static int seq_first(const ds41_grammar *g, int e, const uint32_t *first, const uint8_t *nullable, uint32_t *f) {
    for (; g->el[e].kind != GE_END; e++) {
        const uint32_t *x = g->el[e].kind == GE_CHARS ? g->cs + (size_t)g->el[e].arg * 8 : first + (size_t)g->el[e].arg * 8;
        for (int w = 0; w < 8; w++) f[w] |= x[w];
        if (g->el[e].kind == GE_CHARS || !nullable[g->el[e].arg]) return 0;
    }
    return 1;
}

/* Each element's rule, and each rule's follow set (the bytes that can come right after it
 * completes: the usual FIRST / FOLLOW fixed points). A follow set only filters pop nodes, so
 * a larger one costs time, never bits: past FOLLOW_PASSES every rule's is all bytes. */
static int follow_sets(ds41_gtables *t) {
    const ds41_grammar *g = t->g;
    int R = g->n_rules;
    t->elrule = malloc(((size_t)g->n_el + 1) * sizeof *t->elrule);
    t->follow = calloc((size_t)R * 8 + 8, sizeof *t->follow);
    uint32_t *first = calloc((size_t)R * 8 + 8, sizeof *first);
    uint8_t *nullable = calloc((size_t)R + 1, 1);
    if (!t->elrule || !t->follow || !first || !nullable) { free(first); free(nullable); return -1; }
    for (int r = 0; r < R; r++)
        for (int a = 0; a < g->rule_nalt[r]; a++)
            for (int e = g->alts[g->rule_alt[r] + a]; g->el[e].kind != GE_END; e++) t->elrule[e] = r;
    int changed = 1, pass = 0;
    for (; changed && pass < FOLLOW_PASSES; pass++) {
        changed = 0;
        for (int r = 0; r < R; r++)
            for (int a = 0; a < g->rule_nalt[r]; a++) {
                uint32_t f[8];
                memcpy(f, first + (size_t)r * 8, sizeof f);
                int nl = seq_first(g, g->alts[g->rule_alt[r] + a], first, nullable, f);
                if (memcmp(f, first + (size_t)r * 8, sizeof f)) { memcpy(first + (size_t)r * 8, f, sizeof f); changed = 1; }
                if (nl && !nullable[r]) nullable[r] = changed = 1;
            }
    }
    for (changed = 1; changed && pass < FOLLOW_PASSES; pass++) {
        changed = 0;
        for (int e = 0; e < g->n_el; e++) {
            if (g->el[e].kind != GE_REF) continue;
            uint32_t *fo = t->follow + (size_t)g->el[e].arg * 8, f[8];
            memcpy(f, fo, sizeof f);
            if (seq_first(g, e + 1, first, nullable, f)) {
                const uint32_t *up = t->follow + (size_t)t->elrule[e] * 8;
                for (int w = 0; w < 8; w++) f[w] |= up[w];
            }
            if (memcmp(f, fo, sizeof f)) { memcpy(fo, f, sizeof f); changed = 1; }
        }
    }
    if (changed) memset(t->follow, 0xff, (size_t)R * 8 * sizeof *t->follow);
    free(first);
    free(nullable);
    return 0;
}

/* The pair tables of the positions with many pop nodes. 0, or -1 out of memory. */
static int add_pairs(ds41_gtables *t, ds41_gmatch **lm, uint32_t *acc, int32_t *dst, long long *visits) {
    const ds41_grammar *g = t->g;
    int R = g->n_rules, rc = -1;
    int32_t *ref0 = calloc((size_t)R + 2, sizeof *ref0), *refs = malloc(((size_t)g->n_el + 1) * sizeof *refs);
    int32_t *mark = calloc((size_t)R + 1, sizeof *mark), *elrule = t->elrule;
    int32_t *work = malloc(((size_t)R + 1) * sizeof *work), out[PAIR_BELOW], *pos_el = NULL;
    if (!ref0 || !refs || !mark || !work) goto done;
    for (int e = 0; e < g->n_el; e++) if (g->el[e].kind == GE_REF) ref0[g->el[e].arg + 1]++;
    for (int r = 0; r < R; r++) ref0[r + 1] += ref0[r];
    memcpy(work, ref0, (size_t)R * sizeof *work);   /* a cursor per rule */
    for (int e = 0; e < g->n_el; e++) if (g->el[e].kind == GE_REF) refs[work[g->el[e].arg]++] = e;
    int singles = t->n_pos;
    pos_el = malloc(((size_t)singles + 1) * sizeof *pos_el);   /* each single table's element */
    if (!pos_el) goto done;
    for (int e = 0; e < g->n_el; e++) if (t->pos_ix[e] >= 0) pos_el[t->pos_ix[e]] = e;
    for (int ix = 0; ix < singles; ix++) {
        size_t pops = t->pos[ix].pop_n;
        size_t sub = 0;   /* the trie nodes under its pop nodes: what a mask may walk for it */
        for (size_t k = 0; k < pops; k++) sub += (size_t)(t->v->end[t->pops[t->pos[ix].pop + k]] - t->pops[t->pos[ix].pop + k]);
        if (t->pos[ix].lmax < 0 || (pops <= PAIR_POPS && pops * 64 <= (size_t)t->v->n_nodes && sub * PAIR_SUB <= (size_t)t->v->n_nodes))
            continue;
        int p = pos_el[ix];
        int nb = below_set(g, elrule[p], ref0, refs, elrule, mark, ix + 1, work, out);
        if (nb <= 0) continue;
        gpos *np = realloc(t->pos, ((size_t)t->n_pos + (size_t)nb + 1) * sizeof *np);
        if (!np) goto done;
        t->pos = np;
        t->pos[ix].pair = t->n_pos;
        t->pos[ix].pair_n = nb;
        for (int b = 0; b < nb; b++) {
            int32_t st[2] = { out[b], p };
            t->pos[t->n_pos].below = out[b];
            t->pos[t->n_pos].pair_n = 0;
            t->n_pos++;
            t->n_pairs++;
            if (build_one(t, lm, st, 2, t->n_pos - 1, acc, dst, visits)) goto done;
        }
    }
    rc = 0;
done:
    free(ref0); free(refs); free(mark); free(work); free(pos_el);
    return rc;
}

ds41_gtables *ds41_gtables_new(const ds41_grammar *g, const ds41_gvocab *v, char *err, size_t errcap) {
    ds41_gtables *t = calloc(1, sizeof *t);
    uint32_t *acc = NULL;
    int32_t *dst = NULL;
    ds41_gmatch *lm = NULL;
    if (!t) goto oom;
    t->g = g;
    t->v = v;
    t->words = (v->V + 31) / 32;
    t->pos_ix = malloc((size_t)g->n_el * sizeof *t->pos_ix);
    int n = 0;
    for (int e = 0; e < g->n_el; e++) n += g->el[e].kind == GE_CHARS;
    t->pos = calloc((size_t)n + 1, sizeof *t->pos);
    acc = malloc(2 * (size_t)t->words * sizeof *acc);
    dst = malloc((size_t)(v->max_depth + 2) * sizeof *dst);
    if (!t->pos_ix || !t->pos || !acc || !dst || follow_sets(t)) goto oom;
    long long visits = 0;
    for (int e = 0; e < g->n_el; e++) {
        t->pos_ix[e] = -1;
        if (g->el[e].kind != GE_CHARS) continue;
        t->pos_ix[e] = t->n_pos;
        t->pos[t->n_pos++].below = -1;
        int32_t st[1] = { e };
        int rc = build_one(t, &lm, st, 1, t->n_pos - 1, acc, dst, &visits);
        if (rc < 0) goto oom;
    }
    if (add_pairs(t, &lm, acc, dst, &visits) || !(t->memo = ds41_gdep_new())) goto oom;
    free(t->follow); free(t->elrule);
    t->follow = NULL;
    t->elrule = NULL;
    ds41_gmatch_free(lm);
    free(acc); free(dst);
    return t;
oom:
    snprintf(err, errcap, "grammar: out of memory precomputing the token classes");
    ds41_gmatch_free(lm);
    free(acc); free(dst);
    ds41_gtables_free(t);
    return NULL;
}

void ds41_gtables_free(ds41_gtables *t) {
    if (!t) return;
    free(t->pos_ix); free(t->pos); free(t->bits); free(t->ids); free(t->pops); free(t->follow); free(t->elrule);
    ds41_gdep_free(t->memo);
    free(t);
}

void ds41_gtables_stats(const ds41_gtables *t, size_t *bytes, int *positions, int *pairs, int *skipped) {
    if (bytes)
        *bytes = sizeof *t + (size_t)t->g->n_el * sizeof *t->pos_ix + (size_t)t->n_pos * sizeof *t->pos +
                 t->nbits * sizeof *t->bits + t->nids * sizeof *t->ids + t->npops * sizeof *t->pops;
    if (positions) *positions = t->n_pos - t->n_pairs;
    if (pairs) *pairs = t->n_pairs;
    if (skipped) *skipped = t->n_skipped;
}

int ds41_gmatch_use_tables(ds41_gmatch *m, const ds41_gtables *t) {
    if (!t || t->g != m->g || t->v != m->v) {
        snprintf(m->err, sizeof m->err, "grammar: the tables were built for another grammar or vocabulary");
        return -1;
    }
    size_t pops = 1;
    for (int i = 0; i < t->n_pos; i++) if (t->pos[i].pop_n > pops) pops = t->pos[i].pop_n;
    free(m->seen); free(m->dep); free(m->work_pops); free(m->work_ids);
    m->seen = calloc((size_t)t->n_pos + 1, sizeof *m->seen);
    m->dep = calloc((size_t)t->words, sizeof *m->dep);   /* zero between uses */
    m->work_pops = malloc(pops * sizeof *m->work_pops);
    m->work_ids = malloc(((size_t)m->v->n_toks + 1) * sizeof *m->work_ids);
    if (!m->seen || !m->dep || !m->work_pops || !m->work_ids) return -1;
    m->stamp = 0;
    m->tab = t;
    return 0;
}

/* ------------------------------------------------------------------ masks */

/* The table for stack st[0..len) (len >= 1): its pair when it has one for the element under
 * the top, else its position's; *nbelow: the elements under the table's run. */
static const gpos *pick(const ds41_gtables *t, const int32_t *st, int len, int *nbelow) {
    const gpos *P = &t->pos[t->pos_ix[st[len - 1]]];
    *nbelow = len - 1;
    if (len >= 2)
        for (int k = 0; k < P->pair_n; k++) {
            const gpos *Q = &t->pos[P->pair + k];
            if (Q->below == st[len - 2] && Q->lmax >= 0) { *nbelow = len - 2; return Q; }
        }
    return P;
}

int ds41_gtables_mask(ds41_gmatch *m, int s, uint32_t *mk) {
    const ds41_gtables *t = m->tab;
    const ds41_gvocab *v = m->v;
    size_t off = m->soff[s];
    int n = m->arena[off], nb;
    /* every stack under the guard first: a state the tables do not cover costs nothing here */
    for (size_t i = 0, k = off + 1; i < (size_t)n; i++) {
        int len = m->arena[k];
        if (len) {
            const gpos *P = pick(t, m->arena + k + 1, len, &nb);
            if (P->lmax < 0 || nb + P->lmax > DS41_GRAMMAR_MAX_DEPTH) return 1;
        }
        k += (size_t)len + 1;
    }
    if (++m->stamp == 0) {
        memset(m->seen, 0, (size_t)t->n_pos * sizeof *m->seen);
        m->stamp = 1;
    }
    int32_t below[DS41_GRAMMAR_MAX_DEPTH];
    /* offsets, not pointers: interning a context state may move m->arena */
    for (size_t i = 0, k = off + 1; i < (size_t)n; i++) {
        size_t at = k;
        int len = m->arena[at];
        k += (size_t)len + 1;
        if (!len) continue;
        const gpos *P = pick(t, m->arena + at + 1, len, &nb);
        size_t pi = (size_t)(P - t->pos);
        int first = m->seen[pi] != m->stamp;   /* stacks with the same table share its accepted set */
        if (first) {
            m->seen[pi] = m->stamp;
            or_set(t, P->acc_bits, P->acc, P->acc_n, mk);
        }
        if (!P->pop_n && !P->end_n) continue;
        memcpy(below, m->arena + at + 1, (size_t)nb * sizeof *below);
        int ctx = ds41_gm_stack_state(m, below, nb);
        if (ctx < 0) {
            if (m->err[0]) return -1;
            continue;   /* nothing below survives its own expansion (the depth limit) */
        }
        or_set(t, P->end_bits, P->end, P->end_n, mk);
        if (!P->pop_n) continue;
        /* each pop node's child by a byte that may follow, and its subtree, from the state
         * below: from the memo (grammar_memo.c), else walked and kept */
        uint64_t hb = ds41_gdep_hash(below, nb);
        int32_t *miss = m->work_pops;
        size_t nm = ds41_gdep_or(t->memo, t->pops + P->pop, P->pop_n, below, nb, hb, mk, miss);
        for (size_t e = 0; e < nm; e++) {
            int c = miss[e], lo = v->tok0[c], hi = v->end[c] < v->n_nodes ? v->tok0[v->end[c]] : v->n_toks;
            if (ds41_gm_walk(m, ctx, m->dep, c, v->end[c], v->depth[c] - 1)) {
                memset(m->dep, 0, (size_t)t->words * sizeof *m->dep);
                return -1;
            }
            /* the subtree's tokens are toks[lo..hi): gather the allowed ones, leave m->dep zero */
            int32_t *ids = m->work_ids;
            size_t n = 0;
            for (int k = lo; k < hi; k++) {
                int id = v->toks[k];
                uint32_t bit = 1u << (id & 31);
                if (!(m->dep[id >> 5] & bit)) continue;
                m->dep[id >> 5] &= ~bit;
                mk[id >> 5] |= bit;
                ids[n++] = id;
            }
            ds41_gdep_put(t->memo, c, below, nb, hb, ids, n);
        }
    }
    return 0;
}

void ds41_gtables_memo_stats(const ds41_gtables *t, size_t *bytes, long long *hits, long long *misses, long long *mask_hits) {
    ds41_gdep_stats(t->memo, bytes, hits, misses, mask_hits);
}

ds41_gdep *ds41_gtables_memo(const ds41_gtables *t) { return t ? t->memo : NULL; }
