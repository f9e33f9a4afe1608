/* ds41 tokenizer internals shared by tokenizer_load.c (building the tables from
 * tokenizer.json), tokenizer.c (encode / decode) and engram_map.c. Not a public header. */
#ifndef DS41_TOKENIZER_INTERNAL_H
#define DS41_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

#define TK_MAX_IDS (1 << 24)     /* refuse vocabularies past 16M ids: no real one comes near */
#define TK_MAX_STAGES 16         /* pre-tokenizer Split stages */
#define TK_MAX_TEMPLATE 16       /* ids the post-processor may add on either side */

/* Split behaviours, as Hugging Face's SplitDelimiterBehavior. */
enum { TK_ISOLATED, TK_REMOVED, TK_MERGED_PREV, TK_MERGED_NEXT, TK_CONTIGUOUS };

typedef struct tk_split {
    pcre2_code *re;
    int jit;        /* pcre2_jit_compile succeeded: use pcre2_jit_match */
    int behavior;
    int invert;
} tk_split;

/* String -> index hash (open addressing); the strings live in the tokenizer's arena. */
typedef struct tk_strmap {
    int32_t *slot;  /* vocab map: an id; added map: an index into added[]; -1 = empty */
    uint64_t mask;
} tk_strmap;

/* Byte trie over added-token contents, for leftmost-longest matching. */
typedef struct tk_trie_node {
    int32_t child;   /* first child, -1 if none */
    int32_t sibling; /* next sibling, -1 if none */
    int32_t added;   /* index into tok->added of the token ending here, -1 if none */
    uint8_t byte;
} tk_trie_node;

typedef struct tk_trie {
    tk_trie_node *node;  /* node[0] is the root */
    int n, cap;
    uint8_t first[256];  /* first[b]: some token starts with byte b */
    int n_first;         /* distinct first bytes; when 1, first_byte is it (memchr scan) */
    uint8_t first_byte;
    int n_tokens;
} tk_trie;

typedef struct tk_added {
    int32_t id;
    uint32_t off, len;   /* content, in the arena */
    uint8_t special, lstrip, rstrip, normalized, single_word;
} tk_added;

enum { TK_NORM_NFC = 1, TK_NORM_NFD, TK_NORM_NFKC, TK_NORM_NFKD };

/* Per-id flags. */
enum { TK_ID_PRESENT = 1, TK_ID_ADDED = 2, TK_ID_SPECIAL = 4 };

struct ds41_tokenizer {
    char *path;          /* the tokenizer.json read, for messages */
    int n_ids;           /* largest id + 1 */
    char *arena;         /* every token string and every decoded byte string */
    size_t arena_len, arena_cap;
    uint32_t *str_off, *str_len;   /* id -> token string (added content wins over vocab) */
    uint32_t *voc_off, *voc_len;   /* id -> model.vocab string (UINT32_MAX off: none) */
    uint32_t *dec_off, *dec_len;   /* id -> decoded bytes (ByteLevel inverse, or raw text) */
    uint8_t *id_flags;
    size_t max_dec_len;

    tk_strmap vocab;     /* model.vocab string -> id (what BPE produces) */
    tk_strmap added_map; /* added-token content -> id */

    /* ByteLevel alphabet: byte b is the code point byte_cp[b]; byte_id[b] its vocab id. */
    uint16_t byte_cp[256];
    int16_t cp_byte[512];          /* inverse for code points < 512; -1 elsewhere */
    int32_t byte_id[256];

    /* Ranked merges: key (left << 32 | right) -> (rank << 32 | merged id). */
    uint64_t *merge_key, *merge_val;
    uint64_t merge_mask;
    int n_merges;
    int ignore_merges;
    int32_t unk_id;      /* -1 when the model has no unk_token */
    int fuse_unk;

    tk_added *added;
    int n_added;
    tk_trie trie_raw;    /* added tokens with normalized=false: matched on the raw text */
    tk_trie trie_norm;   /* normalized=true: matched on the normalized text */

    int norm[8];         /* normalizer chain (TK_NORM_*), applied in order */
    int n_norm;

    tk_split split[TK_MAX_STAGES];
    int n_split;
    int bl_prefix_space; /* ByteLevel pre-tokenizer add_prefix_space */
    pcre2_code *bl_re;   /* ByteLevel use_regex: the GPT-2 split, or NULL */
    int bl_re_jit;

    int32_t post_pre[TK_MAX_TEMPLATE], post_post[TK_MAX_TEMPLATE];
    int n_post_pre, n_post_post;
    int bos_id, eos_id;
};

/* Hash of a byte string (FNV-1a folded; enough for vocab-sized tables). */
static inline uint64_t tk_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* Vocab id of the byte-level string s[0..n), or -1. */
int32_t tk_vocab_get(const ds41_tokenizer *tok, const void *s, size_t n);
/* Index into tok->added of the added token with content s[0..n), or -1. */
int32_t tk_added_get(const ds41_tokenizer *tok, const void *s, size_t n);

/* Lossy UTF-8 (Unicode "maximal subpart" rule, the same as Rust's from_utf8_lossy and the
 * WHATWG decoder). At s[0..n): returns the length of the valid character there (> 0); or 0
 * when s[0] starts an invalid sequence, with *bad its maximal-subpart length (one U+FFFD);
 * or -1 when s[0..n) is a valid but incomplete prefix, *bad = n. */
int tk_utf8_next(const unsigned char *s, size_t n, size_t *bad);
/* 1 when s[0..n) is valid UTF-8. */
int tk_utf8_valid(const unsigned char *s, size_t n);

/* Slot of merge key k = (left << 32 | right) in the merge table. */
static inline uint64_t tk_merge_slot(uint64_t k, uint64_t mask) {
    return ((k * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

#endif
