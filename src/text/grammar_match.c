/* ds41 grammar runtime (grammar.h): interned stack-set states, byte transitions, token masks.
 *
 * A stack is the element positions still to match, innermost last; a state is the sorted,
 * deduplicated set of stacks whose tops are byte sets (an empty stack: the output may end).
 * Advancing by a byte keeps the stacks whose top byte set holds it, moves each top one
 * element on, and expands references (each alternative of the rule pushed over the
 * reference's continuation; an alternative's end pops) until every top is a byte set again.
 * The grammar has no left recursion (grammar.c refuses it), so expansion ends.
 *
 * The vocabulary is a trie in preorder: node i has its byte, its depth and the index just
 * past its subtree. A mask walks it once: a node whose byte the parent state refuses skips
 * its subtree; the transition of (state, byte) is a table lookup after its first use. */
#define _GNU_SOURCE  /* qsort_r */
#include "grammar_internal.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ vocabulary */

static const ds41_gvocab *sort_v;
static int cmp_tok(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    const ds41_gvocab *v = sort_v;
    size_t lx = v->len[x], ly = v->len[y], m = lx < ly ? lx : ly;
    int c = memcmp(v->arena + v->off[x], v->arena + v->off[y], m);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

ds41_gvocab *ds41_gvocab_new(int V, const char *const *bytes, const size_t *lens) {
    ds41_gvocab *v = calloc(1, sizeof *v);
    if (!v || V <= 0) { free(v); return NULL; }
    v->V = V;
    size_t total = 0;
    int nt = 0;
    for (int i = 0; i < V; i++)
        if (lens[i] && lens[i] <= TOKEN_MAX) { total += lens[i]; nt++; }
    v->arena = malloc(total + 1);
    v->off = calloc((size_t)V, sizeof *v->off);
    v->len = calloc((size_t)V, sizeof *v->len);
    v->toks = malloc((size_t)(nt + 1) * sizeof *v->toks);
    /* at most one node per byte of every token */
    v->byte = malloc(total + 1);
    v->depth = malloc((total + 1) * sizeof *v->depth);
    v->end = malloc((total + 1) * sizeof *v->end);
    v->tok0 = malloc((total + 1) * sizeof *v->tok0);
    v->ntok = calloc(total + 1, sizeof *v->ntok);
    int32_t *path = malloc((TOKEN_MAX + 1) * sizeof *path);
    if (!v->arena || !v->off || !v->len || !v->toks || !v->byte || !v->depth || !v->end || !v->tok0 || !v->ntok || !path) {
        free(path);
        ds41_gvocab_free(v);
        return NULL;
    }
    size_t o = 0;
    nt = 0;
    for (int i = 0; i < V; i++) {
        if (!lens[i] || lens[i] > TOKEN_MAX) continue;
        memcpy(v->arena + o, bytes[i], lens[i]);
        v->off[i] = o;
        v->len[i] = lens[i];
        o += lens[i];
        v->toks[nt++] = i;
    }
    sort_v = v;   /* qsort has no context argument here; gvocab_new is not reentrant */
    qsort(v->toks, (size_t)nt, sizeof *v->toks, cmp_tok);
    /* preorder: a token shares the prefix of the previous one; new nodes for the rest */
    int n = 0, plen = 0;
    const unsigned char *prev = NULL;
    size_t prevlen = 0;
    for (int t = 0; t < nt; t++) {
        int id = v->toks[t];
        const unsigned char *s = (const unsigned char *)v->arena + v->off[id];
        size_t L = v->len[id], c = 0;
        while (prev && c < L && c < prevlen && c < (size_t)plen && s[c] == prev[c]) c++;
        /* close the nodes deeper than c: their subtrees end here */
        for (int d = plen; d > (int)c; d--) v->end[path[d]] = n;
        plen = (int)c;
        for (size_t k = c; k < L; k++) {
            v->byte[n] = s[k];
            v->depth[n] = (uint16_t)(k + 1);
            v->tok0[n] = t;
            v->ntok[n] = 0;
            path[k + 1] = n;
            n++;
        }
        plen = (int)L;
        int leaf = path[L];
        if (v->ntok[leaf] == 0) v->tok0[leaf] = t;
        v->ntok[leaf]++;
        if ((int)L > v->max_depth) v->max_depth = (int)L;
        prev = s;
        prevlen = L;
    }
    for (int d = plen; d >= 1; d--) v->end[path[d]] = n;
    v->n_nodes = n;
    v->n_toks = nt;
    free(path);
    return v;
}

void ds41_gvocab_free(ds41_gvocab *v) {
    if (!v) return;
    free(v->byte); free(v->depth); free(v->end); free(v->tok0); free(v->ntok); free(v->toks);
    free(v->arena); free(v->off); free(v->len);
    free(v);
}

int ds41_gvocab_size(const ds41_gvocab *v) { return v ? v->V : 0; }

/* ------------------------------------------------------------------ building states */

static int mfail(ds41_gmatch *m, const char *msg) {
    if (!m->err[0]) snprintf(m->err, sizeof m->err, "%s", msg);
    return -1;
}

int ds41_ggrow32(int32_t **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    int32_t *q = realloc(*p, nc * sizeof *q);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

/* Pushes stack base[0..n) + extra (extra >= 0: one more position) onto the worklist, stored
 * as positions then the length (so it pops from the end). */
static int work_push(ds41_gmatch *m, const int32_t *base, int n, int extra) {
    int len = n + (extra >= 0);
    if (len > m->push_max) m->push_max = len;
    if (len > DS41_GRAMMAR_MAX_DEPTH) return 0;   /* nesting past the limit: this path ends */
    if (m->wn + (size_t)len + 1 > WORK_MAX) return mfail(m, "grammar: expansion too large (a limit)");
    if (ds41_ggrow32(&m->work, &m->wcap, m->wn + (size_t)len + 1)) return mfail(m, "grammar: out of memory");
    /* base may point into work itself (the popped stack): memmove */
    if (n) memmove(m->work + m->wn, base, (size_t)n * sizeof *base);
    if (extra >= 0) m->work[m->wn + n] = extra;
    m->work[m->wn + len] = len;
    m->wn += (size_t)len + 1;
    return 0;
}

/* Expands the worklist into out[] (stacks with byte-set tops, or empty). */
static int expand(ds41_gmatch *m) {
    const ds41_grammar *g = m->g;
    long long steps = 0;
    while (m->wn > 0) {
        if (++steps > 4LL * DS41_GRAMMAR_MAX_STACKS * 64) return mfail(m, "grammar: expansion too large (a limit)");
        int len = m->work[m->wn - 1];
        size_t at = m->wn - 1 - (size_t)len;
        m->wn = at;
        int32_t *st = m->work + at;
        if (len == 0 || g->el[st[len - 1]].kind == GE_CHARS) {
            if (ds41_ggrow32(&m->out, &m->ocap, m->on + (size_t)len + 1)) return mfail(m, "grammar: out of memory");
            m->out[m->on] = len;
            memcpy(m->out + m->on + 1, st, (size_t)len * sizeof *st);
            m->on += (size_t)len + 1;
            continue;
        }
        /* a reference: its continuation replaces it, then each alternative goes on top */
        int top = st[len - 1], r = g->el[top].arg;
        int cont = g->el[top + 1].kind != GE_END ? top + 1 : -1;
        /* copy the stack out of work[] before pushing over it */
        int32_t tmp[DS41_GRAMMAR_MAX_DEPTH + 1];
        memcpy(tmp, st, (size_t)(len - 1) * sizeof *st);
        int bl = len - 1;
        if (cont >= 0) tmp[bl++] = cont;
        for (int a = g->rule_nalt[r] - 1; a >= 0; a--) {
            int start = g->alts[g->rule_alt[r] + a];
            if (work_push(m, tmp, bl, g->el[start].kind != GE_END ? start : -1)) return -1;
        }
    }
    return 0;
}

static int cmp_stack(const void *a, const void *b, void *out) {
    const int32_t *x = (const int32_t *)out + *(const int32_t *)a, *y = (const int32_t *)out + *(const int32_t *)b;
    int n = x[0] < y[0] ? x[0] : y[0];
    for (int i = 1; i <= n; i++) if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

static uint64_t hash32(const int32_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint32_t)p[i]) * 0x100000001b3ull;
    return h ^ (h >> 31);
}

static size_t state_size(const ds41_gmatch *m, int s) {
    const int32_t *p = m->arena + m->soff[s];
    size_t k = 1;
    for (int i = 0; i < p[0]; i++) k += (size_t)p[k] + 1;
    return k;
}

/* Interns the stacks in out[] (sorted, deduplicated): the state id, -1 when there is none. */
static int intern(ds41_gmatch *m) {
    if (m->on == 0) return -1;
    size_t ns = 0;
    for (size_t k = 0; k < m->on; k += (size_t)m->out[k] + 1) ns++;
    if (ns > DS41_GRAMMAR_MAX_STACKS * 4) return mfail(m, "grammar: too many parses at once (an ambiguous grammar; a limit)");
    if (ds41_ggrow32(&m->order, &m->ordcap, ns)) return mfail(m, "grammar: out of memory");
    ns = 0;
    for (size_t k = 0; k < m->on; k += (size_t)m->out[k] + 1) m->order[ns++] = (int32_t)k;
    /* qsort_r: matchers intern on several threads at once (the prefetch helper, table builds) */
    qsort_r(m->order, ns, sizeof *m->order, cmp_stack, m->out);
    size_t uniq = 0, total = 1;
    for (size_t i = 0; i < ns; i++) {
        if (uniq && !cmp_stack(&m->order[uniq - 1], &m->order[i], m->out)) continue;
        m->order[uniq++] = m->order[i];
        total += (size_t)m->out[m->order[i]] + 1;
    }
    if (uniq > DS41_GRAMMAR_MAX_STACKS) return mfail(m, "grammar: too many parses at once (an ambiguous grammar; a limit)");
    if (m->an + total > ARENA_MAX) return mfail(m, "grammar: state memory limit reached");
    if (ds41_ggrow32(&m->arena, &m->acap, m->an + total)) return mfail(m, "grammar: out of memory");
    int32_t *p = m->arena + m->an;
    p[0] = (int32_t)uniq;
    size_t w = 1;
    int acc = 0;
    for (size_t i = 0; i < uniq; i++) {
        const int32_t *s = m->out + m->order[i];
        memcpy(p + w, s, ((size_t)s[0] + 1) * sizeof *s);
        acc |= s[0] == 0;
        w += (size_t)s[0] + 1;
    }
    uint64_t h = hash32(p, total);
    size_t mask = m->hcap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        int s = m->ht[i];
        if (s < 0) {
            if (m->ns >= DS41_GRAMMAR_MAX_STATES) return mfail(m, "grammar: too many states (a limit)");
            if (m->ns == m->scap) {
                int nc = m->scap * 2;
                size_t *so = realloc(m->soff, (size_t)nc * sizeof *so);
                if (so) m->soff = so;
                int32_t **tr = realloc(m->trans, (size_t)nc * sizeof *tr);
                if (tr) m->trans = tr;
                uint32_t **mk = realloc(m->mask, (size_t)nc * sizeof *mk);
                if (mk) m->mask = mk;
                uint8_t *ac = realloc(m->acc, (size_t)nc);
                if (ac) m->acc = ac;
                uint16_t **td = m->track_depth ? realloc(m->tdep, (size_t)nc * sizeof *td) : m->tdep;
                if (td) m->tdep = td;
                if (!so || !tr || !mk || !ac || (m->track_depth && !td)) return mfail(m, "grammar: out of memory");
                m->scap = nc;
            }
            s = m->ns++;
            m->soff[s] = m->an;
            m->trans[s] = NULL;
            if (m->track_depth) m->tdep[s] = NULL;
            m->mask[s] = NULL;
            m->acc[s] = (uint8_t)acc;
            m->an += total;
            m->ht[i] = s;
            /* keep the table at most half full */
            if ((size_t)m->ns * 2 > m->hcap) {
                size_t nc = m->hcap * 2;
                int32_t *nt = malloc(nc * sizeof *nt);
                if (!nt) return mfail(m, "grammar: out of memory");
                memset(nt, 0xff, nc * sizeof *nt);
                for (int t = 0; t < m->ns; t++) {
                    uint64_t ht = hash32(m->arena + m->soff[t], state_size(m, t));
                    size_t j = ht & (nc - 1);
                    while (nt[j] >= 0) j = (j + 1) & (nc - 1);
                    nt[j] = t;
                }
                free(m->ht);
                m->ht = nt;
                m->hcap = nc;
            }
            return s;
        }
        if (state_size(m, s) == total && !memcmp(m->arena + m->soff[s], p, total * sizeof *p)) return s;
    }
}

/* ------------------------------------------------------------------ matcher */

ds41_gmatch *ds41_gmatch_new(const ds41_grammar *g, const ds41_gvocab *v) {
    ds41_gmatch *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->g = g;
    m->v = v;
    m->words = (v->V + 31) / 32;
    m->scap = 64;
    m->hcap = 256;
    m->soff = malloc((size_t)m->scap * sizeof *m->soff);
    m->trans = malloc((size_t)m->scap * sizeof *m->trans);
    m->mask = malloc((size_t)m->scap * sizeof *m->mask);
    m->acc = malloc((size_t)m->scap);
    m->ht = malloc(m->hcap * sizeof *m->ht);
    m->mbuf = malloc((size_t)m->words * sizeof *m->mbuf);
    m->dst = malloc((size_t)(v->max_depth + 2) * sizeof *m->dst);
    if (!m->soff || !m->trans || !m->mask || !m->acc || !m->ht || !m->mbuf || !m->dst) { ds41_gmatch_free(m); return NULL; }
    memset(m->ht, 0xff, m->hcap * sizeof *m->ht);
    return m;
}

void ds41_gmatch_free(ds41_gmatch *m) {
    if (!m) return;
    for (int s = 0; s < m->ns; s++) { free(m->trans[s]); free(m->mask[s]); if (m->tdep) free(m->tdep[s]); }
    free(m->tdep); free(m->seen); free(m->dep); free(m->work_pops); free(m->work_ids);
    free(m->soff); free(m->trans); free(m->mask); free(m->acc); free(m->ht); free(m->mbuf); free(m->dst);
    free(m->arena); free(m->out); free(m->work); free(m->order);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

const char *ds41_gmatch_error(const ds41_gmatch *m) { return m->err[0] ? m->err : "grammar: no error"; }

void ds41_gmatch_stats(ds41_gmatch *m, long long *states, long long *computed, long long *cached) {
    pthread_mutex_lock(&m->mu);
    if (states) *states = m->ns;
    if (computed) *computed = m->computed;
    if (cached) *cached = m->cached;
    pthread_mutex_unlock(&m->mu);
}

static int start_locked(ds41_gmatch *m) {
    const ds41_grammar *g = m->g;
    m->on = m->wn = 0;
    int r = g->root;
    for (int a = g->rule_nalt[r] - 1; a >= 0; a--) {
        int start = g->alts[g->rule_alt[r] + a];
        if (work_push(m, NULL, 0, g->el[start].kind != GE_END ? start : -1)) return -1;
    }
    if (expand(m)) return -1;
    return intern(m);
}

/* The public entry points hold m->mu: ds41_gmatch_prefetch may run on another thread. */
int ds41_gmatch_start(ds41_gmatch *m) {
    pthread_mutex_lock(&m->mu);
    int r = start_locked(m);
    pthread_mutex_unlock(&m->mu);
    return r;
}

int ds41_gm_step(ds41_gmatch *m, int s, unsigned byte) {
    int32_t *tr = m->trans[s];
    if (tr && tr[byte] != -2) return tr[byte];
    if (!tr) {
        tr = m->trans[s] = malloc(256 * sizeof *tr);
        if (!tr) return mfail(m, "grammar: out of memory");
        for (int i = 0; i < 256; i++) tr[i] = -2;
    }
    if (m->track_depth && !m->tdep[s] && !(m->tdep[s] = calloc(256, sizeof **m->tdep))) return mfail(m, "grammar: out of memory");
    const ds41_grammar *g = m->g;
    m->on = m->wn = 0;
    m->push_max = 0;
    size_t off = m->soff[s];
    int n = m->arena[off];
    size_t k = off + 1;
    for (int i = 0; i < n; i++) {
        int len = m->arena[k];
        const int32_t *st = m->arena + k + 1;
        k += (size_t)len + 1;
        if (len == 0) continue;
        int top = st[len - 1];
        if (!gcs_has(g->cs + (size_t)g->el[top].arg * 8, byte)) continue;
        int next = g->el[top + 1].kind != GE_END ? top + 1 : -1;
        if (work_push(m, st, len - 1, next)) return -1;
    }
    if (expand(m)) return -1;
    int r = m->on ? intern(m) : -1;
    if (r == -1 && m->err[0]) return -1;
    /* the table may have moved if intern grew the arrays: fetch it again */
    m->trans[s][byte] = r;
    if (m->track_depth) m->tdep[s][byte] = (uint16_t)m->push_max;
    return r;
}

int ds41_gm_stack_state(ds41_gmatch *m, const int32_t *st, int len) {
    m->on = m->wn = 0;
    if (work_push(m, st, len, -1) || expand(m)) return -1;
    return m->on ? intern(m) : -1;
}

static int advance_locked(ds41_gmatch *m, int s, const char *p, size_t n) {
    for (size_t i = 0; i < n && s >= 0; i++) s = ds41_gm_step(m, s, (unsigned char)p[i]);
    return s;
}

int ds41_gmatch_advance_bytes(ds41_gmatch *m, int s, const char *p, size_t n) {
    pthread_mutex_lock(&m->mu);
    s = advance_locked(m, s, p, n);
    pthread_mutex_unlock(&m->mu);
    return s;
}

int ds41_gmatch_advance(ds41_gmatch *m, int s, int id) {
    if (s < 0 || id < 0 || id >= m->v->V || !m->v->len[id]) return -1;
    return ds41_gmatch_advance_bytes(m, s, m->v->arena + m->v->off[id], m->v->len[id]);
}

int ds41_gmatch_can_end(ds41_gmatch *m, int s) {
    pthread_mutex_lock(&m->mu);
    int r = s >= 0 && s < m->ns && m->acc[s];
    pthread_mutex_unlock(&m->mu);
    return r;
}

int ds41_gm_walk(ds41_gmatch *m, int s, uint32_t *mk, int lo, int hi, int d0) {
    const ds41_gvocab *v = m->v;
    m->dst[d0] = s;
    for (int i = lo; i < hi;) {
        int d = v->depth[i], ps = m->dst[d - 1];
        /* the transition table first (a known transition is one load), step() otherwise */
        const int32_t *tr = m->trans[ps];
        int t = tr && tr[v->byte[i]] != -2 ? tr[v->byte[i]] : ds41_gm_step(m, ps, v->byte[i]);
        if (t < 0) {
            if (m->err[0]) return -1;
            i = v->end[i];
            continue;
        }
        m->dst[d] = t;
        for (int k = 0, n = v->ntok[i]; k < n; k++) {
            int id = v->toks[v->tok0[i] + k];
            mk[id >> 5] |= 1u << (id & 31);
        }
        i++;
    }
    return 0;
}

/* The mask of s, cached when the cache has room (keep 1: only then; NULL otherwise). Under mu. */
static const uint32_t *mask_locked(ds41_gmatch *m, int s, int keep) {
    if (s < 0 || s >= m->ns) return NULL;
    if (m->mask[s]) { m->cached++; return m->mask[s]; }
    size_t bytes = (size_t)m->words * sizeof(uint32_t);
    uint32_t *mk = m->mask_bytes + bytes <= MASK_CACHE_BYTES ? malloc(bytes) : NULL;
    if (!mk && keep) return NULL;
    if (!mk) mk = m->mbuf;
    /* with tables: a state another matcher of the grammar computed is copied from the memo */
    ds41_gdep *memo = ds41_gtables_memo(m->tab);
    size_t sn = memo ? state_size(m, s) : 0;
    if (memo && ds41_gdep_mask_get(memo, m->arena + m->soff[s], sn, mk, m->words)) {
        m->shared++;
        if (mk != m->mbuf) { m->mask[s] = mk; m->mask_bytes += bytes; }
        return mk;
    }
    memset(mk, 0, bytes);
    int rc = m->tab ? ds41_gtables_mask(m, s, mk) : 1;
    if (rc == 1) { memset(mk, 0, bytes); rc = ds41_gm_walk(m, s, mk, 0, m->v->n_nodes, 0); }
    if (rc < 0) { if (mk != m->mbuf) free(mk); return NULL; }
    /* the offset again: computing may have interned states and moved the arena */
    if (memo) ds41_gdep_mask_put(memo, m->arena + m->soff[s], sn, mk, m->words);
    m->computed++;
    if (mk != m->mbuf) { m->mask[s] = mk; m->mask_bytes += bytes; }
    return mk;
}

const uint32_t *ds41_gmatch_mask(ds41_gmatch *m, int s) {
    pthread_mutex_lock(&m->mu);
    const uint32_t *mk = mask_locked(m, s, 0);
    pthread_mutex_unlock(&m->mu);
    return mk;
}

int ds41_gmatch_prefetch(ds41_gmatch *m, int s) {
    pthread_mutex_lock(&m->mu);
    int done = s >= 0 && s < m->ns && !m->mask[s] && mask_locked(m, s, 1);
    m->prefetched += done;
    pthread_mutex_unlock(&m->mu);
    return done;
}

/* Applying a mask touches every word of it and, at 129,280 entries, was a third of a token's
 * mask cost when done a bit at a time. Words all allowed are skipped; the rest set -inf in
 * vector blocks: AVX-512 stores -inf under the clear bits directly (16 lanes a store), AVX2
 * blends 8 lanes against the bits spread over them. Either writes the same values as the
 * scalar loop (the tail past the last whole word). */
__attribute__((target("avx512f"))) static void apply_avx512(const uint32_t *mask, float *row, int full) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int w = 0; w < full; w++) {
        uint32_t z = ~mask[w];
        if (!z) continue;
        float *r = row + (size_t)w * 32;
        _mm512_mask_storeu_ps(r, (__mmask16)(z & 0xFFFF), ninf);
        _mm512_mask_storeu_ps(r + 16, (__mmask16)(z >> 16), ninf);
    }
}

__attribute__((target("avx2"))) static void apply_avx2(const uint32_t *mask, float *row, int full) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128), zero = _mm256_setzero_si256();
    for (int w = 0; w < full; w++) {
        uint32_t x = mask[w];
        if (x == 0xFFFFFFFFu) continue;
        float *r = row + (size_t)w * 32;
        for (int k = 0; k < 4; k++) {
            __m256i bits = _mm256_and_si256(_mm256_set1_epi32((int)((x >> (8 * k)) & 0xFF)), lane);
            __m256 clear = _mm256_castsi256_ps(_mm256_cmpeq_epi32(bits, zero));
            _mm256_storeu_ps(r + 8 * k, _mm256_blendv_ps(_mm256_loadu_ps(r + 8 * k), ninf, clear));
        }
    }
}

void ds41_gmask_apply_isa(const uint32_t *mask, float *row, int V, int isa) {
    int full = V / 32;
    if (isa == 2) apply_avx512(mask, row, full);
    else if (isa == 1) apply_avx2(mask, row, full);
    else
        for (int w = 0; w < full; w++)
            for (uint32_t z = ~mask[w]; z; z &= z - 1) row[(size_t)w * 32 + __builtin_ctz(z)] = -INFINITY;
    for (int i = full * 32; i < V; i++)
        if (!(mask[i >> 5] >> (i & 31) & 1)) row[i] = -INFINITY;
}

int ds41_gmask_isa(void) {
    static int isa = -1;   /* chosen once; DS41_ISA=avx2 rules AVX-512 out, as for the kernels */
    int v = __atomic_load_n(&isa, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("DS41_ISA");
        int no512 = e && !strcmp(e, "avx2");
        v = !no512 && __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&isa, v, __ATOMIC_RELAXED);
    }
    return v;
}

void ds41_gmask_apply(const uint32_t *mask, float *row, int V) { ds41_gmask_apply_isa(mask, row, V, ds41_gmask_isa()); }
