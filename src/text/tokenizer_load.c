/* ds41 tokenizer: reading a Hugging Face tokenizer.json (and tokenizer_config.json) into the
 * tables tokenizer.c encodes and decodes with.
 *
 * Supported: model BPE (byte-level: every vocab string is in the ByteLevel alphabet; optional
 * ignore_merges / unk_token); normalizer null, NFC/NFD/NFKC/NFKD or a Sequence of them;
 * pre_tokenizer Split (Regex or String pattern, every behaviour, invert), Digits, ByteLevel
 * (last), or a Sequence of those; post_processor null, ByteLevel, TemplateProcessing (single
 * sequence) or a Sequence of them; decoder ByteLevel (or a Sequence holding only ByteLevel).
 * Everything else is refused with a message naming the field. */
#include "tokenizer_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#define TK_JSON_MAX ((size_t)1 << 30)  /* a tokenizer.json past 1 GiB is not a tokenizer */

/* ---------------------------------------------------------------- UTF-8 ---- */

int tk_utf8_next(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }  /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }  /* <= U+10FFFF */
    else { *bad = 1; return 0; }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) { *bad = n; return -1; }
        unsigned b = s[k];
        if (b < lo || b > hi) { *bad = (size_t)k; return 0; }
        lo = 0x80; hi = 0xBF;
    }
    return need + 1;
}

int tk_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0, bad;
    while (i < n) {
        /* ASCII runs eight bytes at a time: most text is mostly ASCII */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) { i++; continue; }
        int k = tk_utf8_next(s + i, n - i, &bad);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* Decodes one code point of valid UTF-8. */
static uint32_t utf8_cp(const unsigned char *s, int *len) {
    unsigned c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu); }
    if (c < 0xF0) { *len = 3; return ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu); }
    *len = 4;
    return ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

static int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---------------------------------------------------------------- arena and maps ---- */

static int arena_add(ds41_tokenizer *tok, const void *s, size_t n, uint32_t *off, ds41_err *err) {
    if (n > UINT32_MAX / 2 || tok->arena_len + n + 1 > UINT32_MAX)
        return ds41_errf(err, "%s: token strings exceed 4 GiB", tok->path);
    if (tok->arena_len + n + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 1 << 20;
        while (cap < tok->arena_len + n + 1) cap *= 2;
        char *p = realloc(tok->arena, cap);
        if (!p) return ds41_errf(err, "%s: out of memory for token strings", tok->path);
        tok->arena = p;
        tok->arena_cap = cap;
    }
    memcpy(tok->arena + tok->arena_len, s, n);
    tok->arena[tok->arena_len + n] = 0;
    *off = (uint32_t)tok->arena_len;
    tok->arena_len += n + 1;
    return 0;
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c *= 2;
    return c;
}

int32_t tk_vocab_get(const ds41_tokenizer *tok, const void *s, size_t n) {
    if (!tok->vocab.slot) return -1;
    uint64_t i = tk_hash(s, n) & tok->vocab.mask;
    for (;;) {
        int32_t id = tok->vocab.slot[i];
        if (id < 0) return -1;
        if (tok->voc_len[id] == n && !memcmp(tok->arena + tok->voc_off[id], s, n)) return id;
        i = (i + 1) & tok->vocab.mask;
    }
}

int32_t tk_added_get(const ds41_tokenizer *tok, const void *s, size_t n) {
    if (!tok->added_map.slot) return -1;
    uint64_t i = tk_hash(s, n) & tok->added_map.mask;
    for (;;) {
        int32_t a = tok->added_map.slot[i];
        if (a < 0) return -1;
        if (tok->added[a].len == n && !memcmp(tok->arena + tok->added[a].off, s, n)) return a;
        i = (i + 1) & tok->added_map.mask;
    }
}

static int strmap_init(tk_strmap *m, size_t n) {
    uint64_t cap = pow2_at_least(2 * (uint64_t)n + 1);
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return -1;
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = cap - 1;
    return 0;
}

static void strmap_put(tk_strmap *m, const void *s, size_t n, int32_t v) {
    uint64_t i = tk_hash(s, n) & m->mask;
    while (m->slot[i] >= 0) i = (i + 1) & m->mask;
    m->slot[i] = v;
}

/* ---------------------------------------------------------------- tries ---- */

static int trie_node(tk_trie *t, uint8_t byte) {
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 256;
        tk_trie_node *p = realloc(t->node, (size_t)cap * sizeof *p);
        if (!p) return -1;
        t->node = p;
        t->cap = cap;
    }
    tk_trie_node *nd = &t->node[t->n];
    nd->child = nd->sibling = nd->added = -1;
    nd->byte = byte;
    return t->n++;
}

static int trie_add(tk_trie *t, const unsigned char *s, size_t n, int32_t added_index) {
    if (!t->n && trie_node(t, 0) < 0) return -1;
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        int c = t->node[cur].child;
        while (c >= 0 && t->node[c].byte != s[i]) c = t->node[c].sibling;
        if (c < 0) {
            c = trie_node(t, s[i]);
            if (c < 0) return -1;
            t->node[c].sibling = t->node[cur].child;
            t->node[cur].child = c;
        }
        cur = c;
    }
    /* a later duplicate content keeps the first token (the map already has it) */
    if (t->node[cur].added < 0) t->node[cur].added = added_index;
    if (!t->first[s[0]]) {
        t->first[s[0]] = 1;
        t->first_byte = s[0];
        t->n_first++;
    }
    t->n_tokens++;
    return 0;
}

/* ---------------------------------------------------------------- regexes ---- */

/* Hugging Face compiles Split patterns with Oniguruma (Ruby syntax); PCRE2 with UTF+UCP
 * agrees on \p{..} classes, alternation order and look-around, but not on every escape:
 * Oniguruma's \s is Unicode White_Space (PCRE2 adds U+180E), its \w is
 * Letter|Mark|Nd|Pc, its \h is a hex digit, and it reads \uHHHH. Those are rewritten here;
 * what cannot be rewritten faithfully is refused. */
#define TK_WS_LIST "\\t\\n\\x{0b}\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define TK_WORD_LIST "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int translate_regex(const char *in, size_t n, char **out, const char *where, ds41_err *err) {
    sbuf b = {0};
    int in_class = 0;  /* inside [...] */
    int class_start = 0;  /* just after '[' or '[^': a ']' here is literal */
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        if (c == '\\') {
            if (i + 1 >= n) { free(b.p); return ds41_errf(err, "%s: regex ends with a lone backslash", where); }
            char e = in[++i];
            class_start = 0;
            switch (e) {
            case 's': sb_str(&b, in_class ? TK_WS_LIST : "[" TK_WS_LIST "]"); break;
            case 'w': sb_str(&b, in_class ? TK_WORD_LIST : "[" TK_WORD_LIST "]"); break;
            case 'S':
            case 'W':
                if (in_class) {
                    free(b.p);
                    return ds41_errf(err, "%s: regex uses \\%c inside a character class (not supported)", where, e);
                }
                sb_str(&b, e == 'S' ? "[^" TK_WS_LIST "]" : "[^" TK_WORD_LIST "]");
                break;
            case 'h': case 'H': case 'b': case 'B':
                free(b.p);
                return ds41_errf(err, "%s: regex escape \\%c is not supported (Oniguruma and PCRE2 differ)", where, e);
            case 'u': {
                int v = 0, ok = i + 4 < n;
                for (int k = 1; ok && k <= 4; k++) {
                    int h = hexval((unsigned char)in[i + k]);
                    if (h < 0) ok = 0; else v = v * 16 + h;
                }
                if (!ok) { free(b.p); return ds41_errf(err, "%s: regex \\u needs four hex digits", where); }
                char tmp[16];
                snprintf(tmp, sizeof tmp, "\\x{%x}", v);
                sb_str(&b, tmp);
                i += 4;
                break;
            }
            default: {
                char tmp[2] = { '\\', e };
                sb_put(&b, tmp, 2);
                /* copy the rest of a multi-byte character after the backslash */
                while (i + 1 < n && ((unsigned char)in[i + 1] & 0xC0) == 0x80) sb_put(&b, &in[++i], 1);
            }
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            class_start = 1;
            sb_put(&b, &c, 1);
            if (i + 1 < n && in[i + 1] == '^') sb_put(&b, &in[++i], 1);
            continue;
        }
        if (in_class) {
            if (c == ']' && !class_start) in_class = 0;
            else if (c == '[') {
                if (i + 1 < n && in[i + 1] == ':') {  /* POSIX [:name:] passes through */
                    const char *end = strstr(in + i, ":]");
                    if (!end || end >= in + n) { free(b.p); return ds41_errf(err, "%s: unterminated [: in regex", where); }
                    size_t len = (size_t)(end + 2 - (in + i));
                    sb_put(&b, in + i, len);
                    i += len - 1;
                    class_start = 0;
                    continue;
                }
                free(b.p);
                return ds41_errf(err, "%s: nested character classes are not supported", where);
            } else if (c == '&' && i + 1 < n && in[i + 1] == '&') {
                free(b.p);
                return ds41_errf(err, "%s: character class intersection (&&) is not supported", where);
            }
            class_start = 0;
        }
        sb_put(&b, &c, 1);
    }
    if (b.oom) { free(b.p); return ds41_errf(err, "%s: out of memory", where); }
    if (!b.p) sb_put(&b, "", 0);
    *out = b.p;
    return 0;
}

static int compile_regex(const char *pat, size_t n, int literal, pcre2_code **re, int *jit,
                         const char *where, ds41_err *err) {
    char *tr = NULL;
    if (!literal && translate_regex(pat, n, &tr, where, err)) return -1;
    int ec;
    PCRE2_SIZE eo;
    /* MULTILINE: Ruby's ^ and $ are always line anchors */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C);
    *re = pcre2_compile((PCRE2_SPTR)(literal ? pat : tr), literal ? n : strlen(tr), opts, &ec, &eo, NULL);
    free(tr);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return ds41_errf(err, "%s: regex does not compile at offset %zu: %s", where, (size_t)eo, (char *)msg);
    }
    *jit = pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

/* ---------------------------------------------------------------- JSON helpers ---- */

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int dflt, const char *where, const char *file, ds41_err *err, int *out) {
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return ds41_errf(err, "%s: %s.%s: expected true or false", file, where, key);
    *out = json_is_true(v);
    return 0;
}

/* ---------------------------------------------------------------- model ---- */

static int load_model(ds41_tokenizer *tok, json_t *model, json_t *added, ds41_err *err) {
    const char *P = tok->path;
    if (!json_is_object(model)) return ds41_errf(err, "%s: \"model\" missing or not an object", P);
    const char *type = jstr(model, "type");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (type && strcmp(type, "BPE"))
        return ds41_errf(err, "%s: model.type '%s' is not supported (only BPE)", P, type);
    if (!type && !(vocab && merges))
        return ds41_errf(err, "%s: model.type missing and the model is not BPE-shaped (vocab + merges)", P);
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0.0))
        return ds41_errf(err, "%s: model.dropout is not supported (must be null)", P);
    const char *pre = jstr(model, "continuing_subword_prefix"), *suf = jstr(model, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return ds41_errf(err, "%s: model.%s is not supported", P, pre && *pre ? "continuing_subword_prefix" : "end_of_word_suffix");
    int bf;
    if (jbool(model, "byte_fallback", 0, "model", P, err, &bf)) return -1;
    if (bf) return ds41_errf(err, "%s: model.byte_fallback is not supported", P);
    if (jbool(model, "ignore_merges", 0, "model", P, err, &tok->ignore_merges)) return -1;
    if (jbool(model, "fuse_unk", 0, "model", P, err, &tok->fuse_unk)) return -1;
    if (!json_is_object(vocab)) return ds41_errf(err, "%s: model.vocab missing or not an object", P);
    if (!json_is_array(merges)) return ds41_errf(err, "%s: model.merges missing or not an array", P);
    if (added && !json_is_array(added)) return ds41_errf(err, "%s: added_tokens is not an array", P);

    /* ids: the largest one sizes every per-id table */
    long long max_id = -1;
    const char *key;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TK_MAX_IDS)
            return ds41_errf(err, "%s: model.vocab['%s']: id must be an integer in [0, %d)", P, key, TK_MAX_IDS);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t n_added = added ? json_array_size(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i), *id = json_object_get(a, "id");
        if (!json_is_object(a) || !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TK_MAX_IDS)
            return ds41_errf(err, "%s: added_tokens[%zu]: \"id\" must be an integer in [0, %d)", P, i, TK_MAX_IDS);
        if (!json_is_string(json_object_get(a, "content")) || !json_string_length(json_object_get(a, "content")))
            return ds41_errf(err, "%s: added_tokens[%zu]: \"content\" must be a non-empty string", P, i);
    }
    if (max_id < 0) return ds41_errf(err, "%s: model.vocab is empty", P);
    /* added tokens get ids past the vocab (see below): room for all of them */
    size_t vocab_count = json_object_size(vocab);
    if (n_added > TK_MAX_IDS) return ds41_errf(err, "%s: more than %d added_tokens", P, TK_MAX_IDS);
    int n = (int)(max_id + 1 + (long long)n_added);
    tok->n_ids = (int)max_id + 1;
    tok->str_off = calloc((size_t)n, sizeof(uint32_t));
    tok->str_len = calloc((size_t)n, sizeof(uint32_t));
    tok->voc_off = malloc((size_t)n * sizeof(uint32_t));
    tok->voc_len = calloc((size_t)n, sizeof(uint32_t));
    tok->dec_off = calloc((size_t)n, sizeof(uint32_t));
    tok->dec_len = calloc((size_t)n, sizeof(uint32_t));
    tok->id_flags = calloc((size_t)n, 1);
    if (!tok->str_off || !tok->str_len || !tok->voc_off || !tok->voc_len || !tok->dec_off || !tok->dec_len || !tok->id_flags)
        return ds41_errf(err, "%s: out of memory for %d ids", P, n);
    memset(tok->voc_off, 0xff, (size_t)n * sizeof(uint32_t));

    json_object_foreach(vocab, key, v) {
        int id = (int)json_integer_value(v);
        if (tok->voc_off[id] != UINT32_MAX)
            return ds41_errf(err, "%s: model.vocab: id %d is given to both '%s' and '%s'", P, id,
                             tok->arena + tok->voc_off[id], key);
        size_t len = strlen(key);
        if (arena_add(tok, key, len, &tok->voc_off[id], err)) return -1;
        tok->voc_len[id] = (uint32_t)len;
        tok->str_off[id] = tok->voc_off[id];
        tok->str_len[id] = (uint32_t)len;
        tok->id_flags[id] |= TK_ID_PRESENT;
    }
    if (strmap_init(&tok->vocab, json_object_size(vocab))) return ds41_errf(err, "%s: out of memory", P);
    for (int id = 0; id < n; id++)
        if (tok->voc_off[id] != UINT32_MAX) strmap_put(&tok->vocab, tok->arena + tok->voc_off[id], tok->voc_len[id], id);

    const char *unk = jstr(model, "unk_token");
    tok->unk_id = -1;
    if (unk) {
        tok->unk_id = tk_vocab_get(tok, unk, strlen(unk));
        if (tok->unk_id < 0) return ds41_errf(err, "%s: model.unk_token '%s' is not in the vocabulary", P, unk);
    }

    /* merges: "A B" strings (older files) or ["A", "B"] pairs; rank = position */
    size_t nm = json_array_size(merges);
    if (nm > (size_t)INT32_MAX) return ds41_errf(err, "%s: too many merges", P);
    uint64_t cap = pow2_at_least(2 * (uint64_t)nm + 1);
    tok->merge_key = malloc(cap * sizeof(uint64_t));
    tok->merge_val = malloc(cap * sizeof(uint64_t));
    if (!tok->merge_key || !tok->merge_val) return ds41_errf(err, "%s: out of memory for %zu merges", P, nm);
    memset(tok->merge_key, 0xff, cap * sizeof(uint64_t));
    tok->merge_mask = cap - 1;
    tok->n_merges = (int)nm;
    char small[512];
    for (size_t r = 0; r < nm; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return ds41_errf(err, "%s: model.merges[%zu]: expected \"LEFT RIGHT\" (one space), got '%s'", P, r, a);
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            return ds41_errf(err, "%s: model.merges[%zu]: expected a string or a pair of strings", P, r);
        }
        int32_t ia = tk_vocab_get(tok, a, la), ib = tk_vocab_get(tok, b, lb);
        if (ia < 0 || ib < 0)
            return ds41_errf(err, "%s: model.merges[%zu]: '%.*s' is not in the vocabulary", P, r,
                             (int)(ia < 0 ? la : lb), ia < 0 ? a : b);
        char *ab = la + lb <= sizeof small ? small : malloc(la + lb);
        if (!ab) return ds41_errf(err, "%s: out of memory", P);
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb);
        int32_t iab = tk_vocab_get(tok, ab, la + lb);
        if (iab < 0) {
            ds41_errf(err, "%s: model.merges[%zu]: the merged token '%.*s' is not in the vocabulary", P, r,
                      (int)(la + lb), ab);
            if (ab != small) free(ab);
            return -1;
        }
        if (ab != small) free(ab);
        uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint64_t i = tk_merge_slot(k, tok->merge_mask);
        while (tok->merge_key[i] != UINT64_MAX && tok->merge_key[i] != k) i = (i + 1) & tok->merge_mask;
        /* a repeated pair: the later line wins, as in Hugging Face's HashMap collect */
        tok->merge_key[i] = k;
        tok->merge_val[i] = (uint64_t)r << 32 | (uint32_t)iab;
    }

    /* added tokens */
    tok->added = calloc(n_added ? n_added : 1, sizeof *tok->added);
    if (!tok->added || strmap_init(&tok->added_map, n_added)) return ds41_errf(err, "%s: out of memory", P);
    /* Ids as Hugging Face assigns them when it reads the file (AddedVocabulary::add_tokens):
     * a token whose content is in model.vocab takes that id; any other takes the next id past
     * the vocab (vocab entry count, or the largest added id + 1 once that is past it). The
     * "id" field is only checked (Hugging Face warns when it differs; so does ds41). */
    int32_t max_added = -1;
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        tk_added *t = &tok->added[tok->n_added];
        const char *content = json_string_value(json_object_get(a, "content"));
        size_t len = json_string_length(json_object_get(a, "content"));
        int32_t vid = tk_vocab_get(tok, content, len);
        t->id = vid >= 0 ? vid
              : max_added < 0 ? (int32_t)vocab_count
              : max_added >= (int32_t)vocab_count ? max_added + 1 : (int32_t)vocab_count;
        if (vid < 0 && tok->voc_off[t->id] != UINT32_MAX)
            return ds41_errf(err, "%s: added_tokens[%zu] '%s' gets id %d, which model.vocab gives to '%s'", P, i,
                             content, t->id, tok->arena + tok->voc_off[t->id]);
        if (json_integer_value(json_object_get(a, "id")) != t->id)
            ds41_log(1, "%s: added_tokens[%zu] '%s' has \"id\" %lld but is read as id %d (as Hugging Face does)", P, i,
                     content, (long long)json_integer_value(json_object_get(a, "id")), t->id);
        if (t->id > max_added) max_added = t->id;
        if (t->id >= tok->n_ids) tok->n_ids = t->id + 1;
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        int sp, ls, rs, nz, sw;
        if (jbool(a, "special", 0, where, P, err, &sp) || jbool(a, "lstrip", 0, where, P, err, &ls) ||
            jbool(a, "rstrip", 0, where, P, err, &rs) || jbool(a, "normalized", !sp, where, P, err, &nz) ||
            jbool(a, "single_word", 0, where, P, err, &sw))
            return -1;
        if (tk_added_get(tok, content, len) >= 0)
            return ds41_errf(err, "%s: added_tokens[%zu]: content '%s' appears twice", P, i, content);
        t->special = (uint8_t)sp; t->lstrip = (uint8_t)ls; t->rstrip = (uint8_t)rs;
        t->normalized = (uint8_t)nz; t->single_word = (uint8_t)sw;
        if (arena_add(tok, content, len, &t->off, err)) return -1;
        t->len = (uint32_t)len;
        tok->str_off[t->id] = t->off;
        tok->str_len[t->id] = t->len;
        tok->id_flags[t->id] |= TK_ID_PRESENT | TK_ID_ADDED | (sp ? TK_ID_SPECIAL : 0);
        strmap_put(&tok->added_map, content, len, tok->n_added);
        tok->n_added++;
    }
    return 0;
}

/* The matching tries. Tokens with normalized=true are matched on normalized text, so their
 * content is normalized too (Hugging Face's refresh_added_tokens). */
static int build_tries(ds41_tokenizer *tok, ds41_err *err) {
    for (int i = 0; i < tok->n_added; i++) {
        tk_added *t = &tok->added[i];
        const unsigned char *s = (const unsigned char *)tok->arena + t->off;
        size_t n = t->len;
        unsigned char *cur = NULL;
        if (t->normalized)
            for (int k = 0; k < tok->n_norm; k++) {
                int kind = tok->norm[k];
                utf8proc_option_t o = UTF8PROC_STABLE |
                                      (kind == TK_NORM_NFC || kind == TK_NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                                      (kind == TK_NORM_NFKC || kind == TK_NORM_NFKD ? UTF8PROC_COMPAT : 0);
                utf8proc_uint8_t *o8 = NULL;
                utf8proc_ssize_t len = utf8proc_map(cur ? cur : s, (utf8proc_ssize_t)n, &o8, o);
                free(cur);
                if (len < 0) return ds41_errf(err, "%s: added_tokens: cannot normalize '%s'", tok->path, tok->arena + t->off);
                cur = o8;
                n = (size_t)len;
            }
        int rc = n ? trie_add(t->normalized ? &tok->trie_norm : &tok->trie_raw, cur ? cur : s, n, i) : 0;
        /* and such a token's string (what it decodes to) is the normalized content, as
         * Hugging Face's id_to_token shows; its original content still names it */
        if (!rc && cur) {
            uint32_t off;
            rc = arena_add(tok, cur, n, &off, err);
            tok->str_off[t->id] = off;
            tok->str_len[t->id] = (uint32_t)n;
        }
        free(cur);
        if (rc) return ds41_errf(err, "%s: out of memory", tok->path);
    }
    return 0;
}

/* GPT-2's byte <-> code point table: printable Latin-1 maps to itself, the other 68 bytes to
 * U+0100.. in byte order, so every byte has a visible character. */
static void build_byte_alphabet(ds41_tokenizer *tok) {
    int next = 256;
    for (int i = 0; i < 512; i++) tok->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        tok->byte_cp[b] = (uint16_t)(printable ? b : next++);
        tok->cp_byte[tok->byte_cp[b]] = (int16_t)b;
        char u[4];
        int n = utf8_put(tok->byte_cp[b], u);
        tok->byte_id[b] = tk_vocab_get(tok, u, (size_t)n);
    }
}

/* ---------------------------------------------------------------- pipeline pieces ---- */

static int load_normalizer(ds41_tokenizer *tok, json_t *n, ds41_err *err) {
    if (!n || json_is_null(n)) return 0;
    const char *type = jstr(n, "type");
    if (!type) return ds41_errf(err, "%s: normalizer.type missing", tok->path);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers"), *x;
        size_t i;
        if (!json_is_array(list)) return ds41_errf(err, "%s: normalizer Sequence without a normalizers array", tok->path);
        json_array_foreach(list, i, x) if (load_normalizer(tok, x, err)) return -1;
        return 0;
    }
    int kind = !strcmp(type, "NFC") ? TK_NORM_NFC : !strcmp(type, "NFD") ? TK_NORM_NFD
             : !strcmp(type, "NFKC") ? TK_NORM_NFKC : !strcmp(type, "NFKD") ? TK_NORM_NFKD : 0;
    if (!kind) return ds41_errf(err, "%s: normalizer type '%s' is not supported", tok->path, type);
    if (tok->n_norm == (int)(sizeof tok->norm / sizeof tok->norm[0]))
        return ds41_errf(err, "%s: too many normalizers", tok->path);
    tok->norm[tok->n_norm++] = kind;
    return 0;
}

static int add_split(ds41_tokenizer *tok, const char *pat, size_t n, int literal, int behavior, int invert,
                     const char *where, ds41_err *err) {
    if (tok->n_split == TK_MAX_STAGES) return ds41_errf(err, "%s: more than %d pre-tokenizer splits", tok->path, TK_MAX_STAGES);
    tk_split *s = &tok->split[tok->n_split];
    if (compile_regex(pat, n, literal, &s->re, &s->jit, where, err)) return -1;
    s->behavior = behavior;
    s->invert = invert;
    tok->n_split++;
    return 0;
}

static int load_pretok(ds41_tokenizer *tok, json_t *p, int *saw_bytelevel, ds41_err *err) {
    const char *P = tok->path;
    const char *type = jstr(p, "type");
    if (!type) return ds41_errf(err, "%s: pre_tokenizer.type missing", P);
    if (*saw_bytelevel)
        return ds41_errf(err, "%s: pre_tokenizer '%s' after ByteLevel is not supported (ByteLevel must be last)", P, type);
    char where[300];
    snprintf(where, sizeof where, "%s: pre_tokenizer %s", P, type);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers"), *x;
        size_t i;
        if (!json_is_array(list)) return ds41_errf(err, "%s: pre_tokenizer Sequence without a pretokenizers array", P);
        json_array_foreach(list, i, x) if (load_pretok(tok, x, saw_bytelevel, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        if (!re && !lit) return ds41_errf(err, "%s: pattern must be {\"Regex\": ...} or {\"String\": ...}", where);
        if (lit && !*lit) return ds41_errf(err, "%s: empty String pattern", where);
        const char *b = jstr(p, "behavior");
        int beh = !b ? -1 : !strcmp(b, "Isolated") ? TK_ISOLATED : !strcmp(b, "Removed") ? TK_REMOVED
                : !strcmp(b, "MergedWithPrevious") ? TK_MERGED_PREV : !strcmp(b, "MergedWithNext") ? TK_MERGED_NEXT
                : !strcmp(b, "Contiguous") ? TK_CONTIGUOUS : -1;
        if (beh < 0) return ds41_errf(err, "%s: behavior '%s' is not supported", where, b ? b : "(missing)");
        int inv;
        if (jbool(p, "invert", 0, "pre_tokenizer", P, err, &inv)) return -1;
        json_t *pj = json_object_get(pat, re ? "Regex" : "String");
        return add_split(tok, json_string_value(pj), json_string_length(pj), !re, beh, inv, where, err);
    }
    if (!strcmp(type, "Digits")) {
        int ind;
        if (jbool(p, "individual_digits", 0, "pre_tokenizer", P, err, &ind)) return -1;
        /* Hugging Face: each numeric char is a match; Contiguous joins runs of them */
        return add_split(tok, "\\p{N}", 5, 0, ind ? TK_ISOLATED : TK_CONTIGUOUS, 0, where, err);
    }
    if (!strcmp(type, "ByteLevel")) {
        int use_regex;
        if (jbool(p, "add_prefix_space", 1, "pre_tokenizer", P, err, &tok->bl_prefix_space) ||
            jbool(p, "use_regex", 1, "pre_tokenizer", P, err, &use_regex))
            return -1;
        if (use_regex) {
            static const char gpt2[] =
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
            if (compile_regex(gpt2, sizeof gpt2 - 1, 0, &tok->bl_re, &tok->bl_re_jit, where, err)) return -1;
        }
        *saw_bytelevel = 1;
        return 0;
    }
    return ds41_errf(err, "%s: pre_tokenizer type '%s' is not supported", P, type);
}

static int load_post(ds41_tokenizer *tok, json_t *p, int *saw_template, ds41_err *err) {
    const char *P = tok->path;
    if (!p || json_is_null(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) return ds41_errf(err, "%s: post_processor.type missing", P);
    if (!strcmp(type, "ByteLevel")) return 0;  /* offsets only */
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "processors"), *x;
        size_t i;
        if (!json_is_array(list)) return ds41_errf(err, "%s: post_processor Sequence without a processors array", P);
        json_array_foreach(list, i, x) if (load_post(tok, x, saw_template, err)) return -1;
        return 0;
    }
    if (strcmp(type, "TemplateProcessing")) return ds41_errf(err, "%s: post_processor type '%s' is not supported", P, type);
    if (*saw_template) return ds41_errf(err, "%s: more than one TemplateProcessing post_processor", P);
    *saw_template = 1;
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens"), *x;
    if (!json_is_array(single)) return ds41_errf(err, "%s: post_processor.single missing", P);
    int seen_a = 0;
    size_t i;
    json_array_foreach(single, i, x) {
        json_t *st = json_object_get(x, "SpecialToken"), *sq = json_object_get(x, "Sequence");
        if (sq) {
            const char *id = jstr(sq, "id");
            if (seen_a || !id || strcmp(id, "A"))
                return ds41_errf(err, "%s: post_processor.single[%zu]: only one Sequence A is supported", P, i);
            seen_a = 1;
            continue;
        }
        const char *name = jstr(st, "id");
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids"), *y;
        if (!name || !json_is_array(ids))
            return ds41_errf(err, "%s: post_processor.single[%zu]: special token not in special_tokens", P, i);
        size_t k;
        json_array_foreach(ids, k, y) {
            long long v = json_integer_value(y);
            if (!json_is_integer(y) || v < 0 || v >= tok->n_ids)
                return ds41_errf(err, "%s: post_processor.special_tokens['%s']: id out of range", P, name);
            int *cnt = seen_a ? &tok->n_post_post : &tok->n_post_pre;
            if (*cnt == TK_MAX_TEMPLATE) return ds41_errf(err, "%s: post_processor adds too many ids", P);
            (seen_a ? tok->post_post : tok->post_pre)[(*cnt)++] = (int32_t)v;
        }
    }
    if (!seen_a) return ds41_errf(err, "%s: post_processor.single has no Sequence A", P);
    return 0;
}

static int load_decoder(ds41_tokenizer *tok, json_t *d, ds41_err *err) {
    const char *type = jstr(d, "type");
    if (!d || json_is_null(d) || !type)
        return ds41_errf(err, "%s: decoder missing (ByteLevel is required)", tok->path);
    if (!strcmp(type, "ByteLevel")) return 0;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders"), *x;
        size_t i;
        if (!json_is_array(list) || !json_array_size(list))
            return ds41_errf(err, "%s: decoder Sequence without decoders", tok->path);
        json_array_foreach(list, i, x) if (load_decoder(tok, x, err)) return -1;
        return 0;
    }
    return ds41_errf(err, "%s: decoder type '%s' is not supported (only ByteLevel)", tok->path, type);
}

/* What each id decodes to alone: the ByteLevel decoder maps every character back to its
 * byte, and a token holding any character outside the alphabet (an added token such as
 * "<｜User｜>") is taken as its UTF-8 text unchanged, as Hugging Face does. */
static int build_decoded(ds41_tokenizer *tok, ds41_err *err) {
    char *tmp = NULL;
    size_t tcap = 0;
    for (int id = 0; id < tok->n_ids; id++) {
        if (!(tok->id_flags[id] & TK_ID_PRESENT)) continue;
        const unsigned char *s = (const unsigned char *)tok->arena + tok->str_off[id];
        size_t n = tok->str_len[id], o = 0;
        if (n > tcap) {
            char *p = realloc(tmp, n);
            if (!p) { free(tmp); return ds41_errf(err, "%s: out of memory", tok->path); }
            tmp = p;
            tcap = n;
        }
        int mapped = 1;
        for (size_t i = 0; i < n;) {
            int l;
            uint32_t cp = utf8_cp(s + i, &l);
            if (cp >= 512 || tok->cp_byte[cp] < 0) { mapped = 0; break; }
            tmp[o++] = (char)tok->cp_byte[cp];
            i += (size_t)l;
        }
        /* arena_add may move the arena: s is not used after this point */
        if (mapped ? arena_add(tok, tmp, o, &tok->dec_off[id], err)
                   : arena_add(tok, tok->arena + tok->str_off[id], n, &tok->dec_off[id], err)) {
            free(tmp);
            return -1;
        }
        tok->dec_len[id] = (uint32_t)(mapped ? o : n);
        if (tok->dec_len[id] > tok->max_dec_len) tok->max_dec_len = tok->dec_len[id];
    }
    free(tmp);
    return 0;
}

/* tokenizer_config.json: add_bos_token / add_eos_token decide BOS/EOS when present (as
 * transformers' LlamaTokenizerFast rebuilds its post-processor from them); bos_token and
 * eos_token name the ids. */
static int config_token(ds41_tokenizer *tok, json_t *cfg, const char *key, const char *cpath, int *id, ds41_err *err) {
    json_t *v = json_object_get(cfg, key);
    const char *s = json_is_string(v) ? json_string_value(v) : jstr(v, "content");
    *id = -1;
    if (!v || json_is_null(v)) return 0;
    if (!s) return ds41_errf(err, "%s: %s: expected a string or an object with \"content\"", cpath, key);
    *id = ds41_token_id(tok, s);
    if (*id < 0) return ds41_errf(err, "%s: %s '%s' is not a token of %s", cpath, key, s, tok->path);
    return 0;
}

static int load_config(ds41_tokenizer *tok, const char *cpath, ds41_err *err) {
    struct stat st;
    if (stat(cpath, &st) != 0) return 0;  /* optional */
    json_error_t je;
    json_t *cfg = json_load_file(cpath, 0, &je);
    if (!cfg || !json_is_object(cfg)) {
        json_decref(cfg);
        return ds41_errf(err, "%s: invalid JSON at line %d column %d: %s", cpath, je.line, je.column, je.text);
    }
    int rc = -1, bos, eos, add_bos, add_eos;
    json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
    if (config_token(tok, cfg, "bos_token", cpath, &bos, err) || config_token(tok, cfg, "eos_token", cpath, &eos, err) ||
        jbool(cfg, "add_bos_token", 0, "config", cpath, err, &add_bos) ||
        jbool(cfg, "add_eos_token", 0, "config", cpath, err, &add_eos))
        goto done;
    if (bos >= 0) tok->bos_id = bos;
    if (eos >= 0) tok->eos_id = eos;
    if ((ab && !json_is_null(ab)) || (ae && !json_is_null(ae))) {
        if ((add_bos && bos < 0) || (add_eos && eos < 0)) {
            ds41_errf(err, "%s: add_%s_token is true but %s_token is not set", cpath, add_bos && bos < 0 ? "bos" : "eos",
                      add_bos && bos < 0 ? "bos" : "eos");
            goto done;
        }
        tok->n_post_pre = tok->n_post_post = 0;
        if (add_bos) tok->post_pre[tok->n_post_pre++] = bos;
        if (add_eos) tok->post_post[tok->n_post_post++] = eos;
    }
    rc = 0;
done:
    json_decref(cfg);
    return rc;
}

/* ---------------------------------------------------------------- load / free ---- */

/* Builds tok from the tokenizer.json text buf[0..len) (tok->path names it in messages). */
static int load_buffer(ds41_tokenizer *tok, const char *buf, size_t len, ds41_err *err) {
    tok->bos_id = tok->eos_id = -1;
    tok->unk_id = -1;
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!root) {
        return ds41_errf(err, "%s: invalid JSON at line %d column %d (byte %d): %s", tok->path, je.line, je.column,
                         je.position, je.text);
    }
    if (!json_is_object(root)) { ds41_errf(err, "%s: top level is not a JSON object", tok->path); goto done; }
    json_t *trunc = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if (trunc && !json_is_null(trunc)) { ds41_errf(err, "%s: truncation is not supported (must be null)", tok->path); goto done; }
    if (pad && !json_is_null(pad)) { ds41_errf(err, "%s: padding is not supported (must be null)", tok->path); goto done; }
    if (load_model(tok, json_object_get(root, "model"), json_object_get(root, "added_tokens"), err)) goto done;
    build_byte_alphabet(tok);
    for (int b = 0; b < 256; b++)
        if (tok->byte_id[b] < 0 && tok->unk_id < 0) {
            ds41_errf(err, "%s: model.vocab lacks the ByteLevel character for byte 0x%02x (not a byte-level BPE)", tok->path, b);
            goto done;
        }
    if (load_normalizer(tok, json_object_get(root, "normalizer"), err)) goto done;
    if (build_tries(tok, err)) goto done;
    json_t *pt = json_object_get(root, "pre_tokenizer");
    int saw_bl = 0, saw_tpl = 0;
    if (!pt || json_is_null(pt)) { ds41_errf(err, "%s: pre_tokenizer missing (ByteLevel is required)", tok->path); goto done; }
    if (load_pretok(tok, pt, &saw_bl, err)) goto done;
    if (!saw_bl) { ds41_errf(err, "%s: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)", tok->path); goto done; }
    if (load_post(tok, json_object_get(root, "post_processor"), &saw_tpl, err)) goto done;
    if (tok->n_post_pre) tok->bos_id = tok->post_pre[0];
    if (load_decoder(tok, json_object_get(root, "decoder"), err)) goto done;
    if (build_decoded(tok, err)) goto done;
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int ds41_tokenizer_load_json(const char *json, size_t len, const char *name, ds41_tokenizer **out, ds41_err *err) {
    *out = NULL;
    ds41_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok || !(tok->path = strdup(name ? name : "tokenizer.json"))) {
        free(tok);
        return ds41_errf(err, "out of memory");
    }
    if (load_buffer(tok, json, len, err)) {
        ds41_tokenizer_free(tok);
        return -1;
    }
    *out = tok;
    return 0;
}

int ds41_tokenizer_load(const char *path, ds41_tokenizer **out, ds41_err *err) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return ds41_errf(err, "%s: no such file or directory", path);
    char *file = S_ISDIR(st.st_mode) ? ds41_path_join(path, "tokenizer.json") : strdup(path);
    if (!file) return ds41_errf(err, "out of memory");
    /* tokenizer_config.json sits next to tokenizer.json */
    char *dir = strdup(file), *slash = dir ? strrchr(dir, '/') : NULL;
    char *cpath = !dir ? NULL : slash ? (slash[1] = 0, ds41_path_join(dir, "tokenizer_config.json")) : strdup("tokenizer_config.json");
    free(dir);
    ds41_tokenizer *tok = calloc(1, sizeof *tok);
    char *buf = NULL;
    size_t len;
    int rc = -1;
    if (!tok || !cpath) { ds41_errf(err, "out of memory"); goto done; }
    tok->path = file;
    file = NULL;
    if (ds41_read_file(tok->path, TK_JSON_MAX, &buf, &len, err)) goto done;
    if (load_buffer(tok, buf, len, err)) goto done;
    if (load_config(tok, cpath, err)) goto done;
    rc = 0;
done:
    free(buf);
    free(cpath);
    free(file);
    if (rc) ds41_tokenizer_free(tok);
    else *out = tok;
    return rc;
}

void ds41_tokenizer_free(ds41_tokenizer *tok) {
    if (!tok) return;
    for (int i = 0; i < tok->n_split; i++) pcre2_code_free(tok->split[i].re);
    pcre2_code_free(tok->bl_re);
    free(tok->trie_raw.node);
    free(tok->trie_norm.node);
    free(tok->added);
    free(tok->added_map.slot);
    free(tok->vocab.slot);
    free(tok->merge_key);
    free(tok->merge_val);
    free(tok->str_off); free(tok->str_len);
    free(tok->voc_off); free(tok->voc_len);
    free(tok->dec_off); free(tok->dec_len);
    free(tok->id_flags);
    free(tok->arena);
    free(tok->path);
    free(tok);
}

int ds41_tokenizer_vocab_size(const ds41_tokenizer *tok) { return tok->n_ids; }
int ds41_tokenizer_bos(const ds41_tokenizer *tok) { return tok->bos_id; }
int ds41_tokenizer_eos(const ds41_tokenizer *tok) { return tok->eos_id; }

int ds41_token_id(const ds41_tokenizer *tok, const char *s) {
    size_t n = strlen(s);
    int32_t a = tk_added_get(tok, s, n);
    return a >= 0 ? tok->added[a].id : tk_vocab_get(tok, s, n);
}

const char *ds41_token_str(const ds41_tokenizer *tok, int id) {
    if (id < 0 || id >= tok->n_ids || !(tok->id_flags[id] & TK_ID_PRESENT)) return NULL;
    return tok->arena + tok->str_off[id];
}

int ds41_token_plain_bytes(const ds41_tokenizer *tok, int id, const char **p, size_t *n) {
    *p = "";
    *n = 0;
    if (id < 0 || id >= tok->n_ids) return 0;
    uint8_t f = tok->id_flags[id];
    if (!(f & TK_ID_PRESENT) || (f & TK_ID_SPECIAL)) return 0;
    *p = tok->arena + tok->dec_off[id];
    *n = tok->dec_len[id];
    return 1;
}
