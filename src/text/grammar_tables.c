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
#include "grammar_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Trie nodes visited over all positions before the rest are left to the walk: a hostile
 * grammar (400,000 positions) must not take minutes to build. About 4 s on one core. */
enum { BUILD_BUDGET = 1 << 30, LOCAL_STATES = 8000 };
/* A position with more pop nodes than PAIR_POPS or a 64th of the trie (a string's characters, which may end after
 * any byte) also gets one table per element that can lie under it (at most PAIR_BELOW of
 * them): the run from [below, p] pops only where that element's alternative ends (after the
 * closing quote), so a mask walks few pop nodes. */
enum { PAIR_POPS = 256, PAIR_BELOW = 64 };

typedef struct {
    int32_t lmax;          /* longest lone stack pushed; -1: not precomputed (walk the trie) */
    int32_t acc_bits;      /* 1: the accepted set is a bitset at bits + acc; 0: acc_n ids at ids + acc */
    size_t acc, acc_n;
    size_t pop, pop_n;     /* pop_n trie nodes at pops + pop */
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
    size_t nbits, cbits, nids, cids, npops, cpops;
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

/* The lone run of stack st[0..n) (a position, or a pair) over the trie into P (acc: a zeroed bitset of t->words, dst: one
 * int per trie depth). 0, 1 when a limit ended it (the position is left to the walk), -1 out
 * of memory. *visits counts the trie nodes. */
static int build_pos(ds41_gtables *t, ds41_gmatch *lm, const int32_t *st, int n, gpos *P, uint32_t *acc, int32_t *dst,
                     long long *visits) {
    const ds41_gvocab *v = t->v;
    int s0 = ds41_gm_stack_state(lm, st, n);
    if (s0 < 0) return 1;
    int lmax = n;
    size_t nacc = 0, pop0 = t->npops;
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
        if (lm->acc[st]) {   /* a lone stack emptied: the rest depends on the stack below */
            if (grow(&t->pops, &t->cpops, t->npops + 1, sizeof *t->pops)) return -1;
            t->pops[t->npops++] = i;
        }
        if (lm->arena[lm->soff[st]] > lm->acc[st])   /* a non-empty lone stack: accepted */
            for (int k = 0, n = v->ntok[i]; k < n; k++) {
                int id = v->toks[v->tok0[i] + k];
                acc[id >> 5] |= 1u << (id & 31);
                nacc++;
            }
        i++;
    }
    if (nacc < (size_t)t->words) {
        if (grow(&t->ids, &t->cids, t->nids + nacc, sizeof *t->ids)) return -1;
        P->acc_bits = 0;
        P->acc = t->nids;
        for (int w = 0; w < t->words; w++)
            for (uint32_t x = acc[w]; x; x &= x - 1) t->ids[t->nids++] = w * 32 + __builtin_ctz(x);
    } else {
        if (grow(&t->bits, &t->cbits, t->nbits + (size_t)t->words, sizeof *t->bits)) return -1;
        P->acc_bits = 1;
        P->acc = t->nbits;
        memcpy(t->bits + t->nbits, acc, (size_t)t->words * sizeof *acc);
        t->nbits += (size_t)t->words;
    }
    P->acc_n = nacc;
    P->pop = pop0;
    P->pop_n = t->npops - pop0;
    P->lmax = lmax;
    return 0;
}

/* Builds pos[ix] from stack st[0..n): 0 (a limit or the budget leaves it to the walk), -1 out
 * of memory. */
static int build_one(ds41_gtables *t, ds41_gmatch **lm, const int32_t *st, int n, int ix, uint32_t *acc, int32_t *dst,
                     long long *visits) {
    gpos *P = &t->pos[ix];
    P->lmax = -1;
    if (*visits > BUILD_BUDGET) { t->n_skipped++; return 0; }
    /* a fresh lone matcher after a limit, or when its states pile up */
    if (*lm && ((*lm)->err[0] || (*lm)->ns > LOCAL_STATES)) { ds41_gmatch_free(*lm); *lm = NULL; }
    if (!*lm && !(*lm = lone_new(t->g, t->v))) return -1;
    memset(acc, 0, (size_t)t->words * sizeof *acc);
    size_t npops = t->npops;
    int rc = build_pos(t, *lm, st, n, P, acc, dst, visits);
    if (rc < 0) return -1;
    if (rc > 0) { P->lmax = -1; t->npops = npops; t->n_skipped++; }
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

/* The pair tables of the positions with many pop nodes. 0, or -1 out of memory. */
static int add_pairs(ds41_gtables *t, ds41_gmatch **lm, uint32_t *acc, int32_t *dst, long long *visits) {
    const ds41_grammar *g = t->g;
    int R = g->n_rules, rc = -1;
    int32_t *ref0 = calloc((size_t)R + 2, sizeof *ref0), *refs = malloc(((size_t)g->n_el + 1) * sizeof *refs);
    int32_t *elrule = malloc(((size_t)g->n_el + 1) * sizeof *elrule), *mark = calloc((size_t)R + 1, sizeof *mark);
    int32_t *work = malloc(((size_t)R + 1) * sizeof *work), out[PAIR_BELOW];
    if (!ref0 || !refs || !elrule || !mark || !work) goto done;
    for (int r = 0; r < R; r++)
        for (int a = 0; a < g->rule_nalt[r]; a++)
            for (int e = g->alts[g->rule_alt[r] + a]; g->el[e].kind != GE_END; e++) elrule[e] = r;
    for (int e = 0; e < g->n_el; e++) if (g->el[e].kind == GE_REF) ref0[g->el[e].arg + 1]++;
    for (int r = 0; r < R; r++) ref0[r + 1] += ref0[r];
    memcpy(work, ref0, (size_t)R * sizeof *work);   /* a cursor per rule */
    for (int e = 0; e < g->n_el; e++) if (g->el[e].kind == GE_REF) refs[work[g->el[e].arg]++] = e;
    int singles = t->n_pos;
    for (int ix = 0; ix < singles; ix++) {
        size_t pops = t->pos[ix].pop_n;
        if (t->pos[ix].lmax < 0 || (pops <= PAIR_POPS && pops * 64 <= (size_t)t->v->n_nodes)) continue;
        int p = -1;
        for (int e = 0; e < g->n_el && p < 0; e++) if (t->pos_ix[e] == ix) p = e;
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
    free(ref0); free(refs); free(elrule); free(mark); free(work);
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
    acc = malloc((size_t)t->words * sizeof *acc);
    dst = malloc((size_t)(v->max_depth + 2) * sizeof *dst);
    if (!t->pos_ix || !t->pos || !acc || !dst) goto oom;
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
    if (add_pairs(t, &lm, acc, dst, &visits)) goto oom;
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
    free(t->pos_ix); free(t->pos); free(t->bits); free(t->ids); free(t->pops);
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
    free(m->seen);
    m->seen = calloc((size_t)t->n_pos + 1, sizeof *m->seen);
    if (!m->seen) return -1;
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
        if (m->seen[pi] != m->stamp) {   /* stacks with the same table share its accepted set */
            m->seen[pi] = m->stamp;
            if (P->acc_bits) {
                const uint32_t *b = t->bits + P->acc;
                for (int w = 0; w < t->words; w++) mk[w] |= b[w];
            } else if (P->acc_n) {
                const int32_t *ids = t->ids + P->acc;
                for (size_t j = 0; j < P->acc_n; j++) mk[ids[j] >> 5] |= 1u << (ids[j] & 31);
            }
        }
        if (!P->pop_n) continue;
        memcpy(below, m->arena + at + 1, (size_t)nb * sizeof *below);
        int ctx = ds41_gm_stack_state(m, below, nb);
        if (ctx < 0) {
            if (m->err[0]) return -1;
            continue;   /* nothing below survives its own expansion (the depth limit) */
        }
        const int32_t *pn = t->pops + P->pop;
        for (size_t e = 0; e < P->pop_n; e++) {
            int i = pn[e];
            /* the tokens ending at the pop node, then its subtree from the state below */
            for (int k = 0, nt = v->ntok[i]; k < nt; k++) {
                int id = v->toks[v->tok0[i] + k];
                mk[id >> 5] |= 1u << (id & 31);
            }
            if (v->end[i] > i + 1 && ds41_gm_walk(m, ctx, mk, i + 1, v->end[i], v->depth[i])) return -1;
        }
    }
    return 0;
}
