/* ds41 tokenizer: Hugging Face tokenizer.json (byte-level BPE with a Sequence of Split
 * pre-tokenizers, added/special tokens, BOS post-processing), decoding, streaming decode. */
#ifndef DS41_TOKENIZER_H
#define DS41_TOKENIZER_H

#include "common.h"

typedef struct ds41_tokenizer ds41_tokenizer;

/* path: a tokenizer.json file or a directory holding tokenizer.json (and optionally
 * tokenizer_config.json, read for add_bos_token / bos_token). */
int ds41_tokenizer_load(const char *path, ds41_tokenizer **out, ds41_err *err);
/* The same from tokenizer.json text in memory (no tokenizer_config.json); name is used in
 * messages. */
int ds41_tokenizer_load_json(const char *json, size_t len, const char *name, ds41_tokenizer **out, ds41_err *err);
void ds41_tokenizer_free(ds41_tokenizer *tok);

int ds41_tokenizer_vocab_size(const ds41_tokenizer *tok);  /* largest id + 1 */
int ds41_tokenizer_bos(const ds41_tokenizer *tok);         /* -1 if none */
int ds41_tokenizer_eos(const ds41_tokenizer *tok);         /* -1 if none */
/* Id of an exact vocabulary or added-token string, or -1. */
int ds41_token_id(const ds41_tokenizer *tok, const char *s);
/* Raw vocabulary string of an id (byte-level form), or NULL. */
const char *ds41_token_str(const ds41_tokenizer *tok, int id);
/* The decoded bytes of an id that is not special (what a grammar matches: vocabulary entries
 * and non-special added tokens such as the DSML marker): 1 with *p, *n set; 0 (n 0) for special
 * tokens and ids the tokenizer lacks. */
int ds41_token_plain_bytes(const ds41_tokenizer *tok, int id, const char **p, size_t *n);

/* Encodes text[len] (UTF-8; NUL bytes are ordinary characters). Ids equal Hugging Face
 * tokenizers' for the same tokenizer.json (checked on DeepSeek's file by
 * tests/tokenizer.test.sh). special: match special added tokens in the text (HF's
 * split_special_tokens=False); with 0 their text is tokenized as plain text, while
 * non-special added tokens still match (as HF's encode_special_tokens). add_special: apply
 * the post-processor: BOS/EOS per tokenizer_config.json's add_bos_token / add_eos_token when
 * it sets them, else tokenizer.json's TemplateProcessing. Invalid UTF-8 is not an error:
 * each maximal invalid subpart is read as U+FFFD first (ds41_utf8_lossy), which is what the
 * oracle gives for the same bytes decoded lossily. Unicode tables are PCRE2's (14.0) and
 * utf8proc's (15.0). *ids is malloc'd (even when empty); caller frees. */
int ds41_tokenize(const ds41_tokenizer *tok, const char *text, size_t len, int special,
                  int add_special, int32_t **ids, size_t *n_ids, ds41_err *err);

/* A copy of s[0..n) with each invalid UTF-8 sequence (maximal subpart) replaced by U+FFFD:
 * the lossy conversion ds41_tokenize applies to its input, the same as Rust's
 * String::from_utf8_lossy and the WHATWG decoder. NUL-terminated, malloc'd; NULL if out of
 * memory. */
char *ds41_utf8_lossy(const char *s, size_t n, size_t *out_n);

/* Decodes ids to UTF-8 (byte-level decoder; skip_special drops special tokens). Bytes that
 * do not form characters become U+FFFD (from_utf8_lossy); ids the tokenizer lacks (e.g. the
 * model's padded vocab past the last token) decode to nothing, as in HF; a negative id is an
 * error. *text is malloc'd and NUL-terminated. */
int ds41_detokenize(const ds41_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                    char **text, size_t *len, ds41_err *err);

/* Streaming decode: feed ids one at a time; emits only complete UTF-8 sequences (a character
 * split across tokens is held until its last byte arrives; bytes that can never form one
 * become U+FFFD at once). The concatenated output equals ds41_detokenize of all the ids. */
typedef struct ds41_detok_stream {
    const ds41_tokenizer *tok;
    unsigned char pending[8];
    int n_pending;
    int skip_special;   /* 0 after init; set to 1 to drop special tokens */
} ds41_detok_stream;
void ds41_detok_stream_init(ds41_detok_stream *s, const ds41_tokenizer *tok);
/* Output room that is always enough for one push or flush. */
size_t ds41_detok_stream_cap(const ds41_tokenizer *tok);
/* Appends the text completed by id to out (cap bytes); returns the byte count written. With
 * cap < ds41_detok_stream_cap(tok) output past cap is dropped (never written). */
size_t ds41_detok_stream_push(ds41_detok_stream *s, int32_t id, char *out, size_t cap);
/* Flushes what is left: an incomplete sequence becomes one U+FFFD (its maximal subpart), as
 * Hugging Face's from_utf8_lossy does. */
size_t ds41_detok_stream_flush(ds41_detok_stream *s, char *out, size_t cap);

/* Engram compressed-token map (spec 1.7): map[vocab] of compressed ids. Loaded from
 * DIR/engram_token_map.i32 when present (used as is; its size must be 4 * vocab_size),
 * otherwise built from the tokenizer (utf8proc normalization; src/text/engram_map.c) and cached
 * to that file when the directory is writable. dir may be NULL (build only). */
int ds41_engram_token_map(const char *dir, const ds41_tokenizer *tok, int vocab_size,
                          int32_t **map, int *n_compressed, ds41_err *err);

#endif
