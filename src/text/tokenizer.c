/* ds41 tokenizer: encoding text to ids and decoding ids to text, the way Hugging Face's
 * tokenizers crate does for a byte-level BPE tokenizer.json (tables: tokenizer_load.c).
 *
 * Encoding, in Hugging Face's order:
 *   1. invalid UTF-8 is replaced (maximal subparts -> U+FFFD, as from_utf8_lossy does);
 *   2. added tokens with normalized=false are matched on the raw text (leftmost-longest,
 *      honouring special / single_word / lstrip / rstrip);
 *   3. each remaining piece is normalized, then added tokens with normalized=true are matched;
 *   4. each remaining piece goes through the Split stages (PCRE2, compiled once, JIT);
 *   5. ByteLevel maps bytes to the GPT-2 alphabet (here: straight to the byte's vocab id)
 *      and BPE merges by rank (hash table; small words in arrays, long words with a heap),
 *      with a per-call cache of word -> ids;
 *   6. the post-processor adds BOS/EOS when asked.
 * Nothing on the hot path mallocs per token: every buffer lives in one per-call tk_run. */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TK_SHORT_WORD 64       /* symbols: below, O(n^2) array merging beats a heap */
#define TK_CACHE_KEY 46        /* bytes of a word the cache keeps */
#define TK_CACHE_IDS 16

typedef struct tk_cache_slot {
    uint64_t h;
    uint8_t len, n;
    char key[TK_CACHE_KEY];
    int32_t ids[TK_CACHE_IDS];
} tk_cache_slot;

typedef struct tk_segs {
    size_t *a;  /* triples: start, end, is_match */
    size_t n, cap;
} tk_segs;

typedef struct tk_run {
    const ds41_tokenizer *tok;
    int special;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    tk_segs segs[TK_MAX_STAGES];
    int32_t *sym;         /* BPE symbols; short words also use val[] */
    uint64_t *val;        /* short: merge value of pair i; long: the heap */
    int32_t *prev, *next; /* long words: linked list */
    size_t sym_cap, val_cap, prev_cap, next_cap;
    tk_cache_slot *cache;
    uint64_t cache_mask;
    unsigned char *pfx;   /* ByteLevel add_prefix_space copy */
    size_t pfx_cap;
    char *map;            /* ignore_merges: the word in the byte alphabet */
    size_t map_cap;
    char *norm;           /* normalized piece */
    size_t norm_cap;
    int failed;
    ds41_err *err;
} tk_run;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 4 / elem) return -1;
        c *= 2;
    }
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static void run_fail(tk_run *r, const char *what) {
    if (!r->failed) ds41_errf(r->err, "%s: %s", r->tok->path, what);
    r->failed = 1;
}

static inline void emit(tk_run *r, int32_t id) {
    if (r->n == r->cap && grow((void **)&r->ids, &r->cap, r->n + 1, sizeof *r->ids)) {
        run_fail(r, "out of memory for token ids");
        return;
    }
    r->ids[r->n++] = id;
}

/* ---------------------------------------------------------------- BPE ---- */

static inline uint64_t merge_get(const ds41_tokenizer *tok, int32_t a, int32_t b) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t i = tk_merge_slot(k, tok->merge_mask);
    for (;;) {
        uint64_t kk = tok->merge_key[i];
        if (kk == k) return tok->merge_val[i];
        if (kk == UINT64_MAX) return UINT64_MAX;
        i = (i + 1) & tok->merge_mask;
    }
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

/* Merges sym[0..m) in place; returns the new count. The rule (Hugging Face's Word::merge_all):
 * repeatedly apply the lowest-ranked merge among adjacent pairs, leftmost first. Ranks are
 * unique per pair, so "lowest value of (rank << 32 | merged)" is that rule. */
static size_t bpe_short(tk_run *r, size_t m) {
    const ds41_tokenizer *tok = r->tok;
    int32_t *sym = r->sym;
    uint64_t *val = r->val;
    for (size_t i = 0; i + 1 < m; i++) val[i] = merge_get(tok, sym[i], sym[i + 1]);
    while (m > 1) {
        uint64_t best = UINT64_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (val[i] < best) { best = val[i]; bi = i; }
        if (best == UINT64_MAX) break;
        sym[bi] = (int32_t)(uint32_t)best;
        /* drop symbol bi+1 and pair bi+1 (pairs after it shift down by one) */
        if (bi + 2 < m) memmove(sym + bi + 1, sym + bi + 2, (m - bi - 2) * sizeof *sym);
        if (bi + 3 < m) memmove(val + bi + 1, val + bi + 2, (m - bi - 3) * sizeof *val);
        m--;
        if (bi > 0) val[bi - 1] = merge_get(tok, sym[bi - 1], sym[bi]);
        if (bi + 1 < m) val[bi] = merge_get(tok, sym[bi], sym[bi + 1]);
    }
    return m;
}

/* The same rule for long words, O(n log n): a heap of (rank << 32 | position); an entry is
 * stale when the pair now at that position has another rank. */
static size_t bpe_long(tk_run *r, size_t m) {
    const ds41_tokenizer *tok = r->tok;
    int32_t *sym = r->sym, *prev = r->prev, *next = r->next;
    uint64_t *heap = r->val;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < m ? (int32_t)(i + 1) : -1;
    }
    for (size_t i = 0; i + 1 < m; i++) {
        uint64_t v = merge_get(tok, sym[i], sym[i + 1]);
        if (v != UINT64_MAX) heap_push(heap, &hn, (v >> 32) << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t pos = (uint32_t)top, rank = (uint32_t)(top >> 32);
        if (sym[pos] < 0 || next[pos] < 0) continue;
        int32_t nx = next[pos];
        uint64_t v = merge_get(tok, sym[pos], sym[nx]);
        if (v == UINT64_MAX || (uint32_t)(v >> 32) != rank) continue;
        sym[pos] = (int32_t)(uint32_t)v;
        sym[nx] = -1;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        if (prev[pos] >= 0) {
            uint64_t w = merge_get(tok, sym[prev[pos]], sym[pos]);
            if (w != UINT64_MAX) heap_push(heap, &hn, (w >> 32) << 32 | (uint32_t)prev[pos]);
        }
        if (next[pos] >= 0) {
            uint64_t w = merge_get(tok, sym[pos], sym[next[pos]]);
            if (w != UINT64_MAX) heap_push(heap, &hn, (w >> 32) << 32 | pos);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) sym[k++] = sym[i];
    return k;
}

/* One pre-tokenized word (raw bytes) -> ids. */
static void bpe_word(tk_run *r, const unsigned char *s, size_t n) {
    const ds41_tokenizer *tok = r->tok;
    if (n == 1 && tok->byte_id[s[0]] >= 0) {
        emit(r, tok->byte_id[s[0]]);
        return;
    }
    tk_cache_slot *slot = NULL;
    uint64_t h = 0;
    if (r->cache && n <= TK_CACHE_KEY) {
        h = tk_hash(s, n);
        slot = &r->cache[h & r->cache_mask];
        if (slot->h == h && slot->len == n && !memcmp(slot->key, s, n)) {
            for (int i = 0; i < slot->n; i++) emit(r, slot->ids[i]);
            return;
        }
    }
    if (tok->ignore_merges) {
        /* Hugging Face: a word that is itself a vocab token skips merging */
        if (grow((void **)&r->map, &r->map_cap, 2 * n, 1)) { run_fail(r, "out of memory"); return; }
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t cp = tok->byte_cp[s[i]];
            if (cp < 0x80) r->map[o++] = (char)cp;
            else { r->map[o++] = (char)(0xC0 | (cp >> 6)); r->map[o++] = (char)(0x80 | (cp & 0x3F)); }
        }
        int32_t id = tk_vocab_get(tok, r->map, o);
        if (id >= 0) {
            emit(r, id);
            return;
        }
    }
    if (grow((void **)&r->sym, &r->sym_cap, n, sizeof *r->sym) ||
        grow((void **)&r->val, &r->val_cap, n < TK_SHORT_WORD ? TK_SHORT_WORD : 3 * n, sizeof *r->val)) {
        run_fail(r, "out of memory for a word");
        return;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok->byte_id[s[i]];
        if (id < 0) {
            /* not in the alphabet (only with unk_token set; load refuses otherwise) */
            if (tok->fuse_unk && m && r->sym[m - 1] == tok->unk_id) continue;
            id = tok->unk_id;
        }
        r->sym[m++] = id;
    }
    if (m <= TK_SHORT_WORD) {
        m = bpe_short(r, m);
    } else {
        if (grow((void **)&r->prev, &r->prev_cap, n, sizeof *r->prev) ||
            grow((void **)&r->next, &r->next_cap, n, sizeof *r->next)) {
            run_fail(r, "out of memory for a word");
            return;
        }
        m = bpe_long(r, m);
    }
    for (size_t i = 0; i < m; i++) emit(r, r->sym[i]);
    if (slot && m <= TK_CACHE_IDS) {
        slot->h = h;
        slot->len = (uint8_t)n;
        slot->n = (uint8_t)m;
        memcpy(slot->key, s, n);
        memcpy(slot->ids, r->sym, m * sizeof *r->sym);
    }
}

/* ---------------------------------------------------------------- pre-tokenizer ---- */

/* Next match of re in s[0..n) from start (Oniguruma find_iter semantics are applied by the
 * caller). 1 = found, 0 = none, -1 = error. */
static int re_find(tk_run *r, const pcre2_code *re, int jit, const unsigned char *s, size_t n, size_t start,
                   size_t *ms, size_t *me) {
    for (;;) {
        int rc = jit ? pcre2_jit_match(re, s, n, start, 0, r->md, r->mctx)
                     : pcre2_match(re, s, n, start, PCRE2_NO_UTF_CHECK, r->md, r->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !r->jstack) {
            /* the default 32 KiB machine stack ran out on a very long piece: retry with 64 MiB */
            r->jstack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
            if (!r->jstack) { run_fail(r, "out of memory for the regex stack"); return -1; }
            pcre2_jit_stack_assign(r->mctx, NULL, r->jstack);
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[200];
            pcre2_get_error_message(rc, msg, sizeof msg);
            char what[300];
            snprintf(what, sizeof what, "pre-tokenizer regex failed on a %zu-byte piece: %s", n, (char *)msg);
            run_fail(r, what);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
        *ms = ov[0];
        *me = ov[1];
        return 1;
    }
}

static size_t utf8_len_at(const unsigned char *s, size_t n, size_t i) {
    if (i >= n) return 1;
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return i + k <= n ? k : n - i;
}

static void stage(tk_run *r, int k, const unsigned char *s, size_t n);

static void bytelevel(tk_run *r, const unsigned char *s, size_t n) {
    const ds41_tokenizer *tok = r->tok;
    if (tok->bl_prefix_space && s[0] != ' ') {
        if (grow((void **)&r->pfx, &r->pfx_cap, n + 1, 1)) { run_fail(r, "out of memory"); return; }
        r->pfx[0] = ' ';
        memcpy(r->pfx + 1, s, n);
        s = r->pfx;
        n++;
    }
    if (!tok->bl_re) {
        bpe_word(r, s, n);
        return;
    }
    size_t pos = 0, prev = 0, ms, me, last_end = SIZE_MAX;
    while (pos <= n && !r->failed) {
        int f = re_find(r, tok->bl_re, tok->bl_re_jit, s, n, pos, &ms, &me);
        if (f <= 0) break;
        if (ms == me) {
            pos = ms + utf8_len_at(s, n, ms);
            if (last_end == me) continue;
            last_end = me;
            continue;
        }
        if (prev < ms) bpe_word(r, s + prev, ms - prev);
        bpe_word(r, s + ms, me - ms);
        prev = pos = last_end = me;
    }
    if (prev < n && !r->failed) bpe_word(r, s + prev, n - prev);
}

static int seg_push(tk_run *r, tk_segs *g, size_t a, size_t b, size_t m) {
    if (grow((void **)&g->a, &g->cap, 3 * (g->n + 1), sizeof *g->a)) { run_fail(r, "out of memory"); return -1; }
    g->a[3 * g->n] = a;
    g->a[3 * g->n + 1] = b;
    g->a[3 * g->n + 2] = m;
    g->n++;
    return 0;
}

/* Split stage k on the piece s[0..n), then the stages after it. */
static void stage(tk_run *r, int k, const unsigned char *s, size_t n) {
    const ds41_tokenizer *tok = r->tok;
    if (r->failed) return;
    if (k == tok->n_split) {
        bytelevel(r, s, n);
        return;
    }
    const tk_split *sp = &tok->split[k];
    size_t pos = 0, prev = 0, ms, me, last_end = SIZE_MAX;
    if (sp->behavior == TK_ISOLATED) {
        /* every match and every gap is a piece (invert changes nothing here): no list */
        while (pos <= n && !r->failed) {
            int f = re_find(r, sp->re, sp->jit, s, n, pos, &ms, &me);
            if (f <= 0) break;
            if (ms == me) {
                pos = ms + utf8_len_at(s, n, ms);
                last_end = me;
                continue;
            }
            if (prev < ms) stage(r, k + 1, s + prev, ms - prev);
            stage(r, k + 1, s + ms, me - ms);
            prev = pos = last_end = me;
        }
        if (prev < n) stage(r, k + 1, s + prev, n - prev);
        return;
    }
    /* The general case follows Hugging Face's NormalizedString::split: the covering list of
     * (gap | match) segments, empty matches included, folded by the behaviour; then the
     * empty pieces are dropped. */
    tk_segs *g = &r->segs[k];
    g->n = 0;
    while (pos <= n && !r->failed) {
        int f = re_find(r, sp->re, sp->jit, s, n, pos, &ms, &me);
        if (f <= 0) break;
        if (ms == me) {
            size_t next = ms + utf8_len_at(s, n, ms);
            if (last_end == me) { pos = next; continue; }
            if (prev < ms && seg_push(r, g, prev, ms, 0)) return;
            if (seg_push(r, g, ms, me, 1)) return;
            prev = last_end = me;
            pos = next;
            continue;
        }
        if (prev < ms && seg_push(r, g, prev, ms, 0)) return;
        if (seg_push(r, g, ms, me, 1)) return;
        prev = pos = last_end = me;
    }
    if (r->failed) return;
    if (prev < n && seg_push(r, g, prev, n, 0)) return;
    if (sp->invert)
        for (size_t i = 0; i < g->n; i++) g->a[3 * i + 2] ^= 1;
    size_t *a = g->a, out = 0;
    int prev_match = 0;
    switch (sp->behavior) {
    case TK_REMOVED:
        for (size_t i = 0; i < g->n; i++)
            if (!a[3 * i + 2]) { a[3 * out] = a[3 * i]; a[3 * out + 1] = a[3 * i + 1]; out++; }
        break;
    case TK_MERGED_PREV:
        for (size_t i = 0; i < g->n; i++) {
            int m = (int)a[3 * i + 2];
            if (m && !prev_match && out) a[3 * (out - 1) + 1] = a[3 * i + 1];
            else { a[3 * out] = a[3 * i]; a[3 * out + 1] = a[3 * i + 1]; out++; }
            prev_match = m;
        }
        break;
    case TK_CONTIGUOUS:
        for (size_t i = 0; i < g->n; i++) {
            int m = (int)a[3 * i + 2];
            if (m == prev_match && out) a[3 * (out - 1) + 1] = a[3 * i + 1];
            else { a[3 * out] = a[3 * i]; a[3 * out + 1] = a[3 * i + 1]; out++; }
            prev_match = m;
        }
        break;
    case TK_MERGED_NEXT: {
        /* walk backwards: a match joins the piece after it unless that one was a match */
        size_t w = g->n;
        for (size_t i = g->n; i-- > 0;) {
            int m = (int)a[3 * i + 2];
            if (m && !prev_match && w < g->n) a[3 * w] = a[3 * i];
            else { w--; a[3 * w] = a[3 * i]; a[3 * w + 1] = a[3 * i + 1]; }
            prev_match = m;
        }
        for (size_t i = w; i < g->n; i++) { a[3 * out] = a[3 * i]; a[3 * out + 1] = a[3 * i + 1]; out++; }
        break;
    }
    }
    /* the list is consumed before recursing deeper, which uses other lists */
    for (size_t i = 0; i < out && !r->failed; i++) {
        size_t a0 = g->a[3 * i], a1 = g->a[3 * i + 1];
        if (a1 > a0) stage(r, k + 1, s + a0, a1 - a0);
    }
}

/* ---------------------------------------------------------------- added tokens ---- */

static int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, joiners. */
static int is_word(uint32_t c) {
    if (c == '_' || c == 0x200C || c == 0x200D) return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

static uint32_t cp_at(const unsigned char *s, size_t n, size_t *len) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate(s, (utf8proc_ssize_t)n, &c);
    *len = k > 0 ? (size_t)k : 1;
    return k > 0 ? (uint32_t)c : 0xFFFD;
}

static size_t char_start_before(const unsigned char *s, size_t i) {
    do i--; while (i > 0 && (s[i] & 0xC0) == 0x80);
    return i;
}

static int32_t trie_find(const tk_trie *t, const unsigned char *s, size_t n, size_t from, size_t *ms, size_t *me) {
    for (size_t i = from; i < n; i++) {
        if (t->n_first == 1) {
            const unsigned char *p = memchr(s + i, t->first_byte, n - i);
            if (!p) return -1;
            i = (size_t)(p - s);
        } else if (!t->first[s[i]]) {
            continue;
        }
        int cur = 0;
        int32_t best = -1;
        size_t end = 0;
        for (size_t j = i; j < n; j++) {
            int c = t->node[cur].child;
            while (c >= 0 && t->node[c].byte != s[j]) c = t->node[c].sibling;
            if (c < 0) break;
            cur = c;
            if (t->node[c].added >= 0) { best = t->node[c].added; end = j + 1; }
        }
        if (best >= 0) { *ms = i; *me = end; return best; }
    }
    return -1;
}

static void normalized_piece(tk_run *r, const unsigned char *s, size_t n);

/* Hugging Face's AddedVocabulary::find_matches over s[0..n): matched tokens become ids, the
 * text between goes on (phase 1: to normalization; phase 2: to the pre-tokenizer). */
static void split_added(tk_run *r, const tk_trie *t, int phase, const unsigned char *s, size_t n) {
    const ds41_tokenizer *tok = r->tok;
    size_t start_offset = 0, from = 0, ms, me, l;
    while (t->n_tokens && from < n && !r->failed) {
        int32_t ai = trie_find(t, s, n, from, &ms, &me);
        if (ai < 0) break;
        from = me;
        const tk_added *a = &tok->added[ai];
        if (!r->special && a->special) continue;
        if (a->single_word) {
            int before = ms > 0 && is_word(cp_at(s + char_start_before(s, ms), n - char_start_before(s, ms), &l));
            int after = me < n && is_word(cp_at(s + me, n - me, &l));
            if (before || after) continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t j = ms;
            while (j > 0) {
                size_t c = char_start_before(s, j);
                if (!is_ws(cp_at(s + c, n - c, &l))) break;
                j = c;
            }
            start = j > start_offset ? j : start_offset;
        }
        if (a->rstrip) {
            while (stop < n && is_ws(cp_at(s + stop, n - stop, &l))) stop += l;
            from = stop;  /* (Hugging Face resumes at the match end; the two differ only when a
                             token starting with whitespace follows an rstrip token) */
        }
        if (start_offset < start) {
            if (phase == 1) normalized_piece(r, s + start_offset, start - start_offset);
            else stage(r, 0, s + start_offset, start - start_offset);
        }
        emit(r, a->id);
        start_offset = stop;
    }
    if (start_offset < n && !r->failed) {
        if (phase == 1) normalized_piece(r, s + start_offset, n - start_offset);
        else stage(r, 0, s + start_offset, n - start_offset);
    }
}

static void normalized_piece(tk_run *r, const unsigned char *s, size_t n) {
    const ds41_tokenizer *tok = r->tok;
    if (!tok->n_norm) {
        split_added(r, &tok->trie_norm, 2, s, n);
        return;
    }
    unsigned char *cur = NULL;
    size_t cn = n;
    for (int i = 0; i < tok->n_norm; i++) {
        int k = tok->norm[i];
        utf8proc_option_t o = UTF8PROC_STABLE | (k == TK_NORM_NFC || k == TK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                              (k == TK_NORM_NFKC || k == TK_NORM_NFKD ? UTF8PROC_COMPAT : 0);
        utf8proc_uint8_t *o8 = NULL;
        utf8proc_ssize_t len = utf8proc_map(cur ? cur : s, (utf8proc_ssize_t)cn, &o8, o);
        free(cur);
        if (len < 0) { run_fail(r, "normalizer failed"); return; }
        cur = o8;
        cn = (size_t)len;
    }
    if (grow((void **)&r->norm, &r->norm_cap, cn + 1, 1)) { free(cur); run_fail(r, "out of memory"); return; }
    /* nothing below reuses r->norm; the next piece overwrites it after this one is done */
    memcpy(r->norm, cur, cn);
    free(cur);
    split_added(r, &tok->trie_norm, 2, (const unsigned char *)r->norm, cn);
}

/* ---------------------------------------------------------------- encode ---- */

static void run_free(tk_run *r) {
    pcre2_match_data_free(r->md);
    pcre2_match_context_free(r->mctx);
    if (r->jstack) pcre2_jit_stack_free(r->jstack);
    for (int i = 0; i < TK_MAX_STAGES; i++) free(r->segs[i].a);
    free(r->sym); free(r->val); free(r->prev); free(r->next);
    free(r->cache); free(r->pfx); free(r->map); free(r->norm);
}

/* Replaces each maximal invalid subpart with U+FFFD (EF BF BD). */
static unsigned char *utf8_lossy(const unsigned char *s, size_t n, size_t *out_n) {
    if (n > (SIZE_MAX - 1) / 3) return NULL;
    unsigned char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t i = 0, k = 0, bad;
    while (i < n) {
        int l = tk_utf8_next(s + i, n - i, &bad);
        if (l > 0) { memcpy(o + k, s + i, (size_t)l); k += (size_t)l; i += (size_t)l; continue; }
        o[k++] = 0xEF; o[k++] = 0xBF; o[k++] = 0xBD;
        i += bad;
    }
    *out_n = k;
    return o;
}

char *ds41_utf8_lossy(const char *s, size_t n, size_t *out_n) {
    size_t m;
    unsigned char *o = utf8_lossy((const unsigned char *)(s ? s : ""), s ? n : 0, &m);
    if (!o) return NULL;
    o[m] = 0;
    if (out_n) *out_n = m;
    return (char *)o;
}

int ds41_tokenize(const ds41_tokenizer *tok, const char *text, size_t len, int special, int add_special,
                  int32_t **ids, size_t *n_ids, ds41_err *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return ds41_errf(err, "ds41_tokenize: NULL text with length %zu", len);
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    unsigned char *fixed = NULL;
    if (!tk_utf8_valid(s, len)) {
        fixed = utf8_lossy(s, len, &len);
        if (!fixed) return ds41_errf(err, "%s: out of memory replacing invalid UTF-8", tok->path);
        s = fixed;
    }
    tk_run r = { .tok = tok, .special = special, .err = err };
    r.md = pcre2_match_data_create(1, NULL);
    r.mctx = pcre2_match_context_create(NULL);
    if (!r.md || !r.mctx) {
        free(fixed);
        run_free(&r);
        return ds41_errf(err, "%s: out of memory", tok->path);
    }
    /* No backtracking cap: PCRE2's default (10M steps) stops `\s*[\r\n]+` on a 10 MB run of
     * spaces, where the work is still linear. (Oniguruma's cap makes the Rust tokenizer
     * abort on such input; ds41 encodes it.) */
    pcre2_set_match_limit(r.mctx, UINT32_MAX);
    pcre2_set_depth_limit(r.mctx, UINT32_MAX);
    pcre2_set_heap_limit(r.mctx, 4u << 20);  /* KiB: 4 GiB for the interpreter's backtracking */
    if (len >= 4096) {
        /* a word cache pays for itself once there are enough words to repeat */
        uint64_t slots = 256;
        while (slots < len / 32 && slots < (1u << 15)) slots *= 2;
        r.cache = calloc(slots, sizeof *r.cache);
        if (r.cache) r.cache_mask = slots - 1;
    }
    if (add_special)
        for (int i = 0; i < tok->n_post_pre; i++) emit(&r, tok->post_pre[i]);
    split_added(&r, &tok->trie_raw, 1, s, len);
    if (add_special)
        for (int i = 0; i < tok->n_post_post; i++) emit(&r, tok->post_post[i]);
    free(fixed);
    if (r.failed) {
        free(r.ids);
        run_free(&r);
        return -1;
    }
    run_free(&r);
    *ids = r.ids ? r.ids : malloc(sizeof(int32_t));
    if (!*ids) return ds41_errf(err, "%s: out of memory", tok->path);
    *n_ids = r.n;
    return 0;
}

/* ---------------------------------------------------------------- decode ---- */

/* Ids the tokenizer does not know (holes, or past its last id, as the model's padded vocab
 * allows) decode to nothing, as in Hugging Face; a negative id is an error. */
static int id_bytes(const ds41_tokenizer *tok, int32_t id, int skip_special, const char **p, size_t *n) {
    *n = 0;
    *p = "";
    if (id < 0 || id >= tok->n_ids) return 0;
    uint8_t f = tok->id_flags[id];
    if (!(f & TK_ID_PRESENT) || (skip_special && (f & TK_ID_SPECIAL))) return 0;
    *p = tok->arena + tok->dec_off[id];
    *n = tok->dec_len[id];
    return 0;
}

int ds41_detokenize(const ds41_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text,
                    size_t *len, ds41_err *err) {
    *text = NULL;
    if (len) *len = 0;
    uint64_t total = 0;
    const char *p;
    size_t k;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0) return ds41_errf(err, "ds41_detokenize: ids[%zu] = %d is negative", i, ids[i]);
        id_bytes(tok, ids[i], skip_special, &p, &k);
        total += k;
    }
    if (total > SIZE_MAX / 4) return ds41_errf(err, "ds41_detokenize: %zu ids decode to too many bytes", n);
    char *buf = malloc((size_t)total + 1);
    if (!buf) return ds41_errf(err, "ds41_detokenize: out of memory for %llu bytes", (unsigned long long)total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        id_bytes(tok, ids[i], skip_special, &p, &k);
        memcpy(buf + o, p, k);
        o += k;
    }
    buf[o] = 0;
    if (!tk_utf8_valid((unsigned char *)buf, o)) {
        /* byte tokens that do not join into characters: U+FFFD, as from_utf8_lossy */
        size_t m;
        unsigned char *f = utf8_lossy((unsigned char *)buf, o, &m);
        free(buf);
        if (!f) return ds41_errf(err, "ds41_detokenize: out of memory");
        f[m] = 0;
        buf = (char *)f;
        o = m;
    }
    *text = buf;
    if (len) *len = o;
    return 0;
}

/* ---------------------------------------------------------------- streaming ---- */

void ds41_detok_stream_init(ds41_detok_stream *s, const ds41_tokenizer *tok) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
}

size_t ds41_detok_stream_cap(const ds41_tokenizer *tok) { return 3 * (tok->max_dec_len + 8); }

static size_t put(char *out, size_t cap, size_t o, const void *p, size_t n) {
    if (o + n > cap) return cap + 1;  /* marks overflow; callers stop writing */
    memcpy(out + o, p, n);
    return o + n;
}

static size_t feed(ds41_detok_stream *s, const unsigned char *b, size_t n, char *out, size_t cap, size_t o) {
    static const unsigned char fffd[3] = { 0xEF, 0xBF, 0xBD };
    size_t i = 0, bad;
    /* first finish the character held from earlier tokens */
    while (s->n_pending && i < n && o <= cap) {
        s->pending[s->n_pending++] = b[i++];
        int k = tk_utf8_next(s->pending, (size_t)s->n_pending, &bad);
        if (k > 0) {
            o = put(out, cap, o, s->pending, (size_t)k);
            s->n_pending = 0;
        } else if (k == 0) {
            unsigned char rest[8];
            size_t nr = (size_t)s->n_pending - bad;
            memcpy(rest, s->pending + bad, nr);
            s->n_pending = 0;
            o = put(out, cap, o, fffd, 3);
            if (o <= cap) o = feed(s, rest, nr, out, cap, o);
        }
    }
    while (i < n && o <= cap) {
        int k = tk_utf8_next(b + i, n - i, &bad);
        if (k > 0) {
            o = put(out, cap, o, b + i, (size_t)k);
            i += (size_t)k;
        } else if (k == 0) {
            o = put(out, cap, o, fffd, 3);
            i += bad;
        } else {
            memcpy(s->pending, b + i, n - i);  /* at most 3 bytes: an incomplete character */
            s->n_pending = (int)(n - i);
            i = n;
        }
    }
    return o;
}

size_t ds41_detok_stream_push(ds41_detok_stream *s, int32_t id, char *out, size_t cap) {
    const char *p;
    size_t n;
    id_bytes(s->tok, id, s->skip_special, &p, &n);
    if (!n) return 0;
    size_t o = feed(s, (const unsigned char *)p, n, out, cap, 0);
    return o > cap ? cap : o;
}

size_t ds41_detok_stream_flush(ds41_detok_stream *s, char *out, size_t cap) {
    if (!s->n_pending) return 0;
    s->n_pending = 0;
    if (cap < 3) return 0;
    memcpy(out, "\xEF\xBF\xBD", 3);
    return 3;
}
