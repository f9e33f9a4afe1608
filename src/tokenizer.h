/* ds41 tokenizer: Hugging Face tokenizer.json (byte-level BPE with a Sequence of Split
 * pre-tokenizers, added/special tokens, BOS post-processing), decoding, streaming decode. */
#ifndef DS41_TOKENIZER_H
#define DS41_TOKENIZER_H

#include "common.h"

typedef struct ds41_tokenizer ds41_tokenizer;

/* path: a tokenizer.json file or a directory holding tokenizer.json (and optionally
 * tokenizer_config.json, read for add_bos_token / bos_token). */
int ds41_tokenizer_load(const char *path, ds41_tokenizer **out, ds41_err *err);
void ds41_tokenizer_free(ds41_tokenizer *tok);

int ds41_tokenizer_vocab_size(const ds41_tokenizer *tok);  /* largest id + 1 */
int ds41_tokenizer_bos(const ds41_tokenizer *tok);         /* -1 if none */
int ds41_tokenizer_eos(const ds41_tokenizer *tok);         /* -1 if none */
/* Id of an exact vocabulary or added-token string, or -1. */
int ds41_token_id(const ds41_tokenizer *tok, const char *s);
/* Raw vocabulary string of an id (byte-level form), or NULL. */
const char *ds41_token_str(const ds41_tokenizer *tok, int id);

/* Encodes text[len] (UTF-8). special: match added/special tokens in the text (as HF does
 * with split_special_tokens=false); add_special: apply the post-processor (BOS).
 * *ids is malloc'd; caller frees. */
int ds41_tokenize(const ds41_tokenizer *tok, const char *text, size_t len, int special,
                  int add_special, int32_t **ids, size_t *n_ids, ds41_err *err);

/* Decodes ids to UTF-8 (byte-level decoder; skip_special drops special tokens).
 * *text is malloc'd and NUL-terminated. */
int ds41_detokenize(const ds41_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                    char **text, size_t *len, ds41_err *err);

/* Streaming decode: feed ids one at a time; emits only complete UTF-8 sequences. */
typedef struct ds41_detok_stream {
    const ds41_tokenizer *tok;
    unsigned char pending[8];
    int n_pending;
} ds41_detok_stream;
void ds41_detok_stream_init(ds41_detok_stream *s, const ds41_tokenizer *tok);
/* Appends the text completed by id to out (cap bytes); returns the byte count written. */
size_t ds41_detok_stream_push(ds41_detok_stream *s, int32_t id, char *out, size_t cap);
/* Flushes what is left (an incomplete sequence becomes U+FFFD per byte, like HF). */
size_t ds41_detok_stream_flush(ds41_detok_stream *s, char *out, size_t cap);

/* Engram compressed-token map (spec 1.7): map[vocab] of compressed ids. Loaded from
 * DIR/engram_token_map.i32 when present, otherwise built from the tokenizer (and cached to
 * that file when the directory is writable). */
int ds41_engram_token_map(const char *dir, const ds41_tokenizer *tok, int vocab_size,
                          int32_t **map, int *n_compressed, ds41_err *err);

#endif
