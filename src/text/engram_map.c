/* ds41 Engram compressed-token map (spec 1.7): every vocabulary id -> a smaller id shared by
 * the ids whose text normalizes alike, so " The", "the" and "THE" hash as one n-gram token.
 *
 * The recipe, as the official build_compressed_token_map runs it with Hugging Face
 * normalizers: decode the id alone (raw ByteLevel decode, no cleanup); if the text holds
 * U+FFFD (a partial UTF-8 byte token) its key is the raw vocabulary string; otherwise NFKC,
 * NFD, drop combining marks (general category M), lowercase each character, collapse runs of
 * [ \t\r\n] to one space, keep a text that is exactly " " as is, strip Unicode White_Space
 * from both ends, and turn U+E000 into a space (the official code protects the lone space
 * with that private-use sentinel, so a literal U+E000 becomes a space too); an empty result
 * is keyed by the decoded text itself. Distinct keys are numbered in id order.
 *
 * Cached as DIR/engram_token_map.i32: little-endian int32, one per vocabulary id. */
#define _GNU_SOURCE  /* memmem */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#define MAP_FILE "engram_token_map.i32"

static int is_white_space(utf8proc_int32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The normalized key of text[0..n) (valid UTF-8) into *out (malloc'd); -1 on failure. */
static int normalize_key(const char *text, size_t n, char **out, size_t *out_n) {
    utf8proc_uint8_t *nfkc = NULL, *nfd = NULL;
    utf8proc_ssize_t l1 = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n, &nfkc,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (l1 < 0) return -1;
    utf8proc_ssize_t l2 = utf8proc_map(nfkc, l1, &nfd, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    free(nfkc);
    if (l2 < 0) return -1;
    /* code points after dropping marks, lowercasing and collapsing [ \t\r\n]+ */
    utf8proc_int32_t *cp = malloc(((size_t)l2 + 1) * sizeof *cp);
    if (!cp) { free(nfd); return -1; }
    size_t m = 0;
    for (utf8proc_ssize_t i = 0; i < l2;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(nfd + i, l2 - i, &c);
        if (k <= 0) { free(cp); free(nfd); return -1; }
        i += k;
        utf8proc_category_t cat = utf8proc_category(c);
        if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME) continue;
        c = utf8proc_tolower(c);
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            if (m && cp[m - 1] == ' ') continue;
            c = ' ';
        }
        cp[m++] = c;
    }
    free(nfd);
    size_t a = 0, b = m;
    if (!(m == 1 && cp[0] == ' ')) {  /* a lone space survives the strip */
        while (a < b && is_white_space(cp[a])) a++;
        while (b > a && is_white_space(cp[b - 1])) b--;
    }
    char *o = malloc(4 * (b - a) + 1);
    if (!o) { free(cp); return -1; }
    size_t on = 0;
    for (size_t i = a; i < b; i++)
        on += (size_t)utf8proc_encode_char(cp[i] == 0xE000 ? ' ' : cp[i], (utf8proc_uint8_t *)o + on);
    o[on] = 0;
    free(cp);
    *out = o;
    *out_n = on;
    return 0;
}

typedef struct keymap {
    char **key;
    size_t *len;
    int32_t *val;
    uint64_t mask;
} keymap;

static uint64_t key_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 31);
}

/* Id of key (taking ownership of it), assigning *next when new. */
static int32_t keymap_id(keymap *km, char *key, size_t n, int32_t *next) {
    uint64_t i = key_hash(key, n) & km->mask;
    while (km->key[i]) {
        if (km->len[i] == n && !memcmp(km->key[i], key, n)) {
            free(key);
            return km->val[i];
        }
        i = (i + 1) & km->mask;
    }
    km->key[i] = key;
    km->len[i] = n;
    km->val[i] = (*next)++;
    return km->val[i];
}

static int build_map(const ds41_tokenizer *tok, int vocab_size, int32_t *map, int *n_compressed, ds41_err *err) {
    keymap km = {0};
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)vocab_size + 1) cap *= 2;
    km.key = calloc(cap, sizeof *km.key);
    km.len = calloc(cap, sizeof *km.len);
    km.val = calloc(cap, sizeof *km.val);
    km.mask = cap - 1;
    int rc = -1;
    int32_t next = 0;
    if (!km.key || !km.len || !km.val) { ds41_errf(err, "engram token map: out of memory"); goto done; }
    for (int id = 0; id < vocab_size; id++) {
        char *text;
        size_t n;
        int32_t one = id;
        if (ds41_detokenize(tok, &one, 1, 0, &text, &n, err)) goto done;
        char *key;
        size_t kn;
        if (memmem(text, n, "\xEF\xBF\xBD", 3)) {
            const char *raw = ds41_token_str(tok, id);
            kn = raw ? strlen(raw) : 0;
            key = malloc(kn + 1);
            if (key) memcpy(key, raw ? raw : "", kn + 1);
            free(text);
        } else {
            if (normalize_key(text, n, &key, &kn)) {
                free(text);
                ds41_errf(err, "engram token map: normalizing id %d failed", id);
                goto done;
            }
            if (kn == 0) {
                free(key);
                key = text;
                kn = n;
            } else {
                free(text);
            }
        }
        if (!key) { ds41_errf(err, "engram token map: out of memory"); goto done; }
        map[id] = keymap_id(&km, key, kn, &next);
    }
    *n_compressed = next;
    rc = 0;
done:
    if (km.key)
        for (uint64_t i = 0; i <= km.mask; i++) free(km.key[i]);
    free(km.key);
    free(km.len);
    free(km.val);
    return rc;
}

static int read_map(const char *path, int vocab_size, int32_t *map, int *n_compressed, ds41_err *err) {
    char *buf;
    size_t len;
    uint64_t want = (uint64_t)vocab_size * 4;
    struct stat st;
    if (stat(path, &st) == 0 && (uint64_t)st.st_size != want)
        return ds41_errf(err, "%s: %lld bytes, expected %llu (vocab size %d x int32)", path, (long long)st.st_size,
                         (unsigned long long)want, vocab_size);
    if (ds41_read_file(path, (size_t)want, &buf, &len, err)) return -1;
    if (len != want) {
        free(buf);
        return ds41_errf(err, "%s: %zu bytes, expected %llu (vocab size %d x int32)", path, len,
                         (unsigned long long)want, vocab_size);
    }
    int32_t max = -1;
    for (int i = 0; i < vocab_size; i++) {
        const unsigned char *p = (const unsigned char *)buf + 4 * (size_t)i;
        int32_t v = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        if (v < 0 || v >= vocab_size) {
            free(buf);
            return ds41_errf(err, "%s: entry %d (byte offset %llu) is %d, outside [0, %d)", path, i,
                             4ull * (unsigned long long)i, v, vocab_size);
        }
        map[i] = v;
        if (v > max) max = v;
    }
    free(buf);
    *n_compressed = max + 1;
    return 0;
}

/* Written to a temporary name and renamed, so a reader never sees half a file. */
static int write_map(const char *path, const int32_t *map, int n) {
    size_t pl = strlen(path) + 32;
    char *tmp = malloc(pl);
    if (!tmp) return -1;
    snprintf(tmp, pl, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) { free(tmp); return -1; }
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        uint32_t v = (uint32_t)map[i];
        unsigned char b[4] = { (unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24) };
        ok = fwrite(b, 1, 4, f) == 4;
    }
    ok = (fclose(f) == 0) && ok;
    if (ok) ok = rename(tmp, path) == 0;
    if (!ok) remove(tmp);
    free(tmp);
    return ok ? 0 : -1;
}

int ds41_engram_token_map(const char *dir, const ds41_tokenizer *tok, int vocab_size, int32_t **map,
                          int *n_compressed, ds41_err *err) {
    *map = NULL;
    *n_compressed = 0;
    if (vocab_size <= 0) return ds41_errf(err, "engram token map: vocab size %d must be positive", vocab_size);
    int32_t *m = malloc((size_t)vocab_size * sizeof *m);
    if (!m) return ds41_errf(err, "engram token map: out of memory for %d ids", vocab_size);
    char *path = dir ? ds41_path_join(dir, MAP_FILE) : NULL;
    if (dir && !path) { free(m); return ds41_errf(err, "out of memory"); }
    struct stat st;
    int rc;
    if (path && stat(path, &st) == 0) {
        rc = read_map(path, vocab_size, m, n_compressed, err);
    } else {
        if (!tok) {
            rc = ds41_errf(err, "engram token map: %s is absent and no tokenizer was given to build it", path ? path : "(no dir)");
        } else {
            rc = build_map(tok, vocab_size, m, n_compressed, err);
            if (!rc && path && write_map(path, m, vocab_size))
                ds41_log(1, "could not cache the Engram token map as %s: %s (using it from memory)", path, strerror(errno));
        }
    }
    free(path);
    if (rc) free(m);
    else *map = m;
    return rc;
}
