/* Tokenizer unit tests on a small byte-level BPE written here (no npm needed): exact ids,
 * added-token rules, empty / special-only / NUL / invalid UTF-8 / 10 MB inputs, streaming
 * decode, the Engram map cache, and malformed tokenizer.json files (each a clear error).
 * Conformance against Hugging Face on DeepSeek's real tokenizer is tests/tokenizer.test.sh. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tokenizer.h"

static char tmpdir[256];

/* GPT-2's byte alphabet: byte b -> code point */
static unsigned byte_cp(int b) {
    int n = 256;
    for (int i = 0; i < 256; i++) {
        int printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
        if (i == b) return printable ? (unsigned)i : (unsigned)n;
        if (!printable) n++;
    }
    return 0;
}

static void put_utf8(unsigned cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; o[1] = 0; }
    else { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); o[2] = 0; }
}

/* The mini tokenizer: ids 0..255 are the bytes (in byte order), then nine merges building
 * "hello" (259) and "Ġworld" (264); added tokens <s> (265, special, BOS by template),
 * <tool> (266, not special, normalized), <ls> (267, special, lstrip). */
static json_t *mini_json(void) {
    json_t *vocab = json_object();
    char u[4];
    for (int b = 0; b < 256; b++) {
        put_utf8(byte_cp(b), u);
        json_object_set_new(vocab, u, json_integer(b));
    }
    static const char *merges[][3] = { { "h", "e", "he" }, { "l", "l", "ll" }, { "he", "ll", "hell" }, { "hell", "o", "hello" },
                                       { "Ġ", "w", "Ġw" }, { "o", "r", "or" }, { "Ġw", "or", "Ġwor" }, { "l", "d", "ld" },
                                       { "Ġwor", "ld", "Ġworld" } };
    json_t *ml = json_array();
    for (int i = 0; i < 9; i++) {
        char m[64];
        snprintf(m, sizeof m, "%s %s", merges[i][0], merges[i][1]);
        json_array_append_new(ml, json_string(m));
        json_object_set_new(vocab, merges[i][2], json_integer(256 + i));
    }
    json_error_t je;
    json_t *root = json_loads(
        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
        "\"added_tokens\":["
        "{\"id\":265,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
        "{\"id\":266,\"content\":\"<tool>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,\"special\":false},"
        "{\"id\":267,\"content\":\"<ls>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[]},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Isolated\",\"invert\":false},"
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
        "\"pair\":[],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[265],\"tokens\":[\"<s>\"]}}},"
        "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
        "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false}}",
        0, &je);
    if (!root) {
        fprintf(stderr, "mini json: %s at %d\n", je.text, je.column);
        exit(1);
    }
    json_t *model = json_object_get(root, "model");
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", ml);
    return root;
}

static char *write_text(const char *name, const char *text, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    fwrite(text, 1, n, f);
    fclose(f);
    return path;
}

static char *write_json(const char *name, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    char *p = write_text(name, s, strlen(s));
    free(s);
    return p;
}

static ds41_tokenizer *mini;

static int enc(const char *s, size_t n, int special, int add, int32_t *out, size_t cap) {
    int32_t *ids;
    size_t k;
    ds41_err err;
    if (ds41_tokenize(mini, s, n, special, add, &ids, &k, &err)) {
        printf("  tokenize failed: %s\n", err.msg);
        return -1;
    }
    for (size_t i = 0; i < k && i < cap; i++) out[i] = ids[i];
    free(ids);
    return (int)k;
}

static int same(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && !memcmp(a, b, (size_t)na * sizeof *a);
}

static void test_load(void) {
    CHECK(ds41_tokenizer_vocab_size(mini) == 268, "vocab size %d", ds41_tokenizer_vocab_size(mini));
    CHECK(ds41_tokenizer_bos(mini) == 265, "bos %d", ds41_tokenizer_bos(mini));
    CHECK(ds41_tokenizer_eos(mini) == -1, "eos %d", ds41_tokenizer_eos(mini));
    CHECK(ds41_token_id(mini, "hello") == 259, "hello");
    CHECK(ds41_token_id(mini, "<tool>") == 266, "<tool>");
    CHECK(ds41_token_id(mini, "nope") == -1, "absent");
    CHECK(ds41_token_str(mini, 264) && !strcmp(ds41_token_str(mini, 264), "Ġworld"), "str 264");
    CHECK(ds41_token_str(mini, 268) == NULL && ds41_token_str(mini, -1) == NULL, "out of range str");
}

static void test_encode_exact(void) {
    int32_t ids[64];
    int n = enc("hello world", 11, 1, 0, ids, 64);
    int32_t want[] = { 259, 264 };
    CHECK(same(ids, n, want, 2), "hello world: n=%d", n);
    n = enc("hello world", 11, 1, 1, ids, 64);
    int32_t want_bos[] = { 265, 259, 264 };
    CHECK(same(ids, n, want_bos, 3), "with BOS: n=%d", n);
    /* digits split in threes before BPE; "1234" -> "123","4" -> bytes */
    n = enc("1234", 4, 1, 0, ids, 64);
    int32_t want_num[] = { '1', '2', '3', '4' };
    CHECK(same(ids, n, want_num, 4), "1234: n=%d", n);
    /* "hellohello..." (100 bytes) is one piece: the long-word path */
    char buf[101];
    for (int i = 0; i < 20; i++) memcpy(buf + 5 * i, "hello", 5);
    n = enc(buf, 100, 1, 0, ids, 64);
    int ok = n == 20;
    for (int i = 0; i < n && ok; i++) ok = ids[i] == 259;
    CHECK(ok, "20 x hello as one word: n=%d", n);
}

static void test_empty_and_special_only(void) {
    int32_t ids[64];
    CHECK(enc("", 0, 1, 0, ids, 64) == 0, "empty");
    int n = enc("", 0, 1, 1, ids, 64);
    CHECK(n == 1 && ids[0] == 265, "empty with BOS: just BOS");
    int32_t *p;
    size_t k;
    ds41_err err;
    CHECK(ds41_tokenize(mini, NULL, 0, 1, 0, &p, &k, &err) == 0 && k == 0, "NULL text, length 0");
    free(p);
    n = enc("<s><s><tool>", 12, 1, 0, ids, 64);
    int32_t want[] = { 265, 265, 266 };
    CHECK(same(ids, n, want, 3), "only special text: n=%d", n);
    /* special=0: <s> is text (bytes '<' 's' '>' after the punctuation split), <tool> (not
     * special) still matches */
    n = enc("<s><tool>", 9, 0, 0, ids, 64);
    int32_t want_ns[] = { '<', 's', '>', 266 };
    CHECK(same(ids, n, want_ns, 4), "special as text: n=%d [%d %d %d %d]", n, ids[0], ids[1], ids[2], ids[3]);
    /* lstrip: the spaces before <ls> are swallowed */
    n = enc("hello   <ls>", 12, 1, 0, ids, 64);
    int32_t want_ls[] = { 259, 267 };
    CHECK(same(ids, n, want_ls, 2), "lstrip: n=%d", n);
}

static void test_nul_bytes(void) {
    int32_t ids[64];
    int n = enc("a\0b\0", 4, 1, 0, ids, 64);
    int32_t want[] = { 'a', 0, 'b', 0 };
    CHECK(same(ids, n, want, 4), "NUL bytes are byte tokens: n=%d", n);
    char *t;
    size_t len;
    ds41_err err;
    CHECK(ds41_detokenize(mini, ids, (size_t)n, 0, &t, &len, &err) == 0 && len == 4 && !memcmp(t, "a\0b\0", 4),
          "NUL round trip");
    free(t);
}

static void test_invalid_utf8(void) {
    /* maximal subparts: each becomes one U+FFFD */
    static const struct { const char *in; size_t n; const char *out; } cases[] = {
        { "\xff", 1, "\xEF\xBF\xBD" },
        { "\xe4\xb8", 2, "\xEF\xBF\xBD" },
        { "\xe4\xb8" "A", 3, "\xEF\xBF\xBD" "A" },
        { "\xf0\x9f\x98", 3, "\xEF\xBF\xBD" },
        { "\xc0\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD" },
        { "\xed\xa0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },
        { "\xf4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" },
        { "a\x80z", 3, "a\xEF\xBF\xBDz" },
        { "\xe4\xbd\xa0", 3, "\xe4\xbd\xa0" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        char *o = ds41_utf8_lossy(cases[i].in, cases[i].n, &n);
        CHECK(o && n == strlen(cases[i].out) && !memcmp(o, cases[i].out, n), "lossy case %zu", i);
        free(o);
    }
    int32_t a[64], b[64];
    int na = enc("x\xffy\xe4\xb8", 5, 1, 0, a, 64);
    int nb = enc("x\xEF\xBF\xBDy\xEF\xBF\xBD", 8, 1, 0, b, 64);
    CHECK(na > 0 && same(a, na, b, nb), "invalid UTF-8 encodes as its lossy text");
}

static void test_detokenize(void) {
    int32_t ids[] = { 265, 259, 264, 1000000, 266 };
    char *t;
    size_t n;
    ds41_err err;
    CHECK(ds41_detokenize(mini, ids, 5, 0, &t, &n, &err) == 0 && !strcmp(t, "<s>hello world<tool>") && n == 20,
          "decode, unknown id dropped: '%s'", t);
    free(t);
    CHECK(ds41_detokenize(mini, ids, 5, 1, &t, &n, &err) == 0 && !strcmp(t, "hello world<tool>"), "skip special");
    free(t);
    int32_t neg[] = { 1, -5 };
    CHECK(ds41_detokenize(mini, neg, 2, 0, &t, &n, &err) == -1 && strstr(err.msg, "negative"), "negative id: %s", err.msg);
    int32_t half[] = { 0xe4, 0xb8 };  /* the first two bytes of 中 */
    CHECK(ds41_detokenize(mini, half, 2, 0, &t, &n, &err) == 0 && !strcmp(t, "\xEF\xBF\xBD"), "partial char -> one U+FFFD");
    free(t);
}

static unsigned rng_state = 12345;
static unsigned rng(void) {
    rng_state = rng_state * 1103515245u + 12345u;
    return rng_state >> 8;
}

static int valid_utf8(const char *s, size_t n) {
    size_t m;
    char *o = ds41_utf8_lossy(s, n, &m);
    int ok = o && m == n && !memcmp(o, s, n);
    free(o);
    return ok;
}

static void test_stream(void) {
    ds41_detok_stream st;
    char out[256];
    size_t cap = ds41_detok_stream_cap(mini);
    CHECK(cap <= sizeof out, "stream cap %zu", cap);
    ds41_detok_stream_init(&st, mini);
    /* 你 = e4 bd a0 as three byte tokens: nothing until the last */
    size_t a = ds41_detok_stream_push(&st, 0xe4, out, cap);
    size_t b = ds41_detok_stream_push(&st, 0xbd, out, cap);
    size_t c = ds41_detok_stream_push(&st, 0xa0, out, cap);
    CHECK(a == 0 && b == 0 && c == 3 && !memcmp(out, "\xe4\xbd\xa0", 3), "held until complete: %zu %zu %zu", a, b, c);
    CHECK(ds41_detok_stream_flush(&st, out, cap) == 0, "nothing left");
    ds41_detok_stream_push(&st, 0xe4, out, cap);
    CHECK(ds41_detok_stream_flush(&st, out, cap) == 3 && !memcmp(out, "\xEF\xBF\xBD", 3), "incomplete flushes as U+FFFD");
    /* a byte that can never start a character is emitted as U+FFFD at once */
    CHECK(ds41_detok_stream_push(&st, 0xff, out, cap) == 3, "0xff at once");
    ds41_detok_stream_push(&st, 0xe4, out, cap);
    size_t k = ds41_detok_stream_push(&st, 'A', out, cap);
    CHECK(k == 4 && !memcmp(out, "\xEF\xBF\xBD" "A", 4), "broken sequence then ASCII: %zu", k);
    /* random sequences: every push is valid UTF-8, the concatenation equals detokenize */
    int bad_valid = 0, bad_equal = 0;
    for (int trial = 0; trial < 3000; trial++) {
        int32_t ids[24];
        int n = 1 + (int)(rng() % 24);
        for (int i = 0; i < n; i++) {
            unsigned r = rng() % 10;
            ids[i] = r < 4 ? (int32_t)(0x80 + rng() % 0x80) : r < 6 ? (int32_t)(0xC2 + rng() % 0x33)
                   : r < 8 ? (int32_t)(rng() % 0x80) : (int32_t)(256 + rng() % 12);
        }
        char all[24 * 64 + 8];
        size_t o = 0;
        ds41_detok_stream_init(&st, mini);
        for (int i = 0; i < n; i++) {
            size_t w = ds41_detok_stream_push(&st, ids[i], out, cap);
            if (!valid_utf8(out, w)) bad_valid++;
            memcpy(all + o, out, w);
            o += w;
        }
        size_t w = ds41_detok_stream_flush(&st, out, cap);
        memcpy(all + o, out, w);
        o += w;
        char *t;
        size_t tn;
        ds41_err err;
        if (ds41_detokenize(mini, ids, (size_t)n, 0, &t, &tn, &err) || tn != o || memcmp(t, all, o)) bad_equal++;
        free(t);
    }
    CHECK(bad_valid == 0, "%d pushes emitted a partial character", bad_valid);
    CHECK(bad_equal == 0, "%d streams differ from detokenize", bad_equal);
    /* a too-small cap never overflows */
    ds41_detok_stream_init(&st, mini);
    char tiny[2] = { 'x', 'x' };
    CHECK(ds41_detok_stream_push(&st, 259, tiny, 2) <= 2, "cap respected");
}

static void test_ten_mb_line(void) {
    size_t reps = 10 * 1024 * 1024 / 12 + 1, n = reps * 12;
    char *s = malloc(n);
    for (size_t i = 0; i < reps; i++) memcpy(s + 12 * i, "hello world ", 12);
    int32_t *ids;
    size_t k;
    ds41_err err;
    int rc = ds41_tokenize(mini, s, n, 1, 0, &ids, &k, &err);
    /* pieces "hello", " world", " hello", ..., " ": there is no "Ġ h" merge, so each later
     * " hello" is Ġ (id 32) + hello; the text ends with a lone space */
    int ok = rc == 0 && k == 3 * reps;
    for (size_t i = 0; ok && i < k; i++) ok = ids[i] == (i % 3 == 0 ? 259 : i % 3 == 1 ? 264 : ' ');
    CHECK(ok, "10 MB line: rc=%d k=%zu (want %zu)", rc, k, 3 * reps);
    char *t;
    size_t tn;
    CHECK(rc == 0 && ds41_detokenize(mini, ids, k, 0, &t, &tn, &err) == 0 && tn == n && !memcmp(t, s, n), "10 MB round trip");
    if (rc == 0) { free(ids); free(t); }
    free(s);
}

/* ---------------------------------------------------------------- bad files ---- */

static void expect_error(const char *what, json_t *j, const char *needle) {
    char *p = write_json("bad.json", j);
    ds41_tokenizer *t = NULL;
    ds41_err err = {0};
    int rc = ds41_tokenizer_load(p, &t, &err);
    CHECK(rc == -1 && t == NULL && strstr(err.msg, needle), "%s: rc=%d msg='%s' (want '%s')", what, rc, err.msg, needle);
    ds41_tokenizer_free(t);
    json_decref(j);
}

static json_t *mod(const char *path1, const char *path2, json_t *v) {
    json_t *j = mini_json(), *o = json_object_get(j, path1);
    if (path2) json_object_set_new(o, path2, v);
    else json_object_set_new(j, path1, v);
    return j;
}

static void test_bad_files(void) {
    /* truncated */
    json_t *j = mini_json();
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    char *p = write_text("trunc.json", s, strlen(s) / 2);
    free(s);
    ds41_tokenizer *t = NULL;
    ds41_err err = {0};
    CHECK(ds41_tokenizer_load(p, &t, &err) == -1 && strstr(err.msg, "invalid JSON") && strstr(err.msg, "trunc.json"),
          "truncated: %s", err.msg);
    CHECK(ds41_tokenizer_load("/nonexistent/dir", &t, &err) == -1 && strstr(err.msg, "no such file"), "missing: %s", err.msg);
    p = write_text("arr.json", "[]", 2);
    CHECK(ds41_tokenizer_load(p, &t, &err) == -1 && strstr(err.msg, "not a JSON object"), "array: %s", err.msg);

    /* merges referencing unknown tokens */
    j = mini_json();
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"), json_string("zz qq"));
    expect_error("merge of unknown tokens", j, "'zz' is not in the vocabulary");
    j = mini_json();
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"), json_string("a b"));
    expect_error("merge result unknown", j, "merged token 'ab' is not in the vocabulary");
    j = mini_json();
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"), json_string("abc"));
    expect_error("merge without a space", j, "expected \"LEFT RIGHT\"");
    /* duplicate ids */
    j = mini_json();
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "dup", json_integer(5));
    expect_error("duplicate vocab id", j, "id 5 is given to both");
    j = mini_json();
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "neg", json_integer(-3));
    expect_error("negative id", j, "id must be an integer");
    /* unsupported features */
    expect_error("model type", mod("model", "type", json_string("WordPiece")), "model.type 'WordPiece' is not supported");
    expect_error("dropout", mod("model", "dropout", json_real(0.1)), "dropout is not supported");
    expect_error("byte_fallback", mod("model", "byte_fallback", json_true()), "byte_fallback is not supported");
    expect_error("normalizer", mod("normalizer", NULL, json_pack("{s:s}", "type", "Lowercase")), "normalizer type 'Lowercase'");
    expect_error("pre_tokenizer", mod("pre_tokenizer", NULL, json_pack("{s:s}", "type", "Whitespace")),
                 "pre_tokenizer type 'Whitespace' is not supported");
    expect_error("no ByteLevel", mod("pre_tokenizer", NULL, json_pack("{s:s,s:b}", "type", "Digits", "individual_digits", 1)),
                 "no ByteLevel");
    expect_error("decoder", mod("decoder", NULL, json_pack("{s:s}", "type", "WordPiece")), "decoder type 'WordPiece'");
    expect_error("post_processor", mod("post_processor", NULL, json_pack("{s:s}", "type", "BertProcessing")),
                 "post_processor type 'BertProcessing'");
    expect_error("truncation", mod("truncation", NULL, json_pack("{s:i}", "max_length", 5)), "truncation is not supported");
    expect_error("bad regex",
                 mod("pre_tokenizer", NULL,
                     json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s}]}", "type", "Sequence", "pretokenizers", "type", "Split",
                               "pattern", "Regex", "(unclosed", "behavior", "Isolated", "type", "ByteLevel")),
                 "does not compile");
    expect_error("Oniguruma-only escape",
                 mod("pre_tokenizer", NULL,
                     json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s}]}", "type", "Sequence", "pretokenizers", "type", "Split",
                               "pattern", "Regex", "\\h+", "behavior", "Isolated", "type", "ByteLevel")),
                 "\\h is not supported");
    j = mini_json();
    json_object_set_new(json_array_get(json_object_get(j, "added_tokens"), 0), "content", json_string(""));
    expect_error("empty added token", j, "non-empty string");

    /* a tokenizer_config.json that is not JSON */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/cfg", tmpdir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(system(cmd) == 0, "mkdir");
    j = mini_json();
    write_json("cfg/tokenizer.json", j);
    json_decref(j);
    write_text("cfg/tokenizer_config.json", "{\"add_bos_token\": tru", 21);
    CHECK(ds41_tokenizer_load(dir, &t, &err) == -1 && strstr(err.msg, "tokenizer_config.json: invalid JSON"), "config: %s", err.msg);
    /* a good config: add_bos_token false turns the template's BOS off, eos named */
    const char *cfg = "{\"add_bos_token\": false, \"eos_token\": {\"content\": \"<ls>\"}}";
    write_text("cfg/tokenizer_config.json", cfg, strlen(cfg));
    CHECK(ds41_tokenizer_load(dir, &t, &err) == 0, "config load: %s", err.msg);
    if (t) {
        int32_t *ids;
        size_t k;
        CHECK(ds41_tokenize(t, "hello", 5, 1, 1, &ids, &k, &err) == 0 && k == 1 && ids[0] == 259, "no BOS by config");
        free(ids);
        CHECK(ds41_tokenizer_eos(t) == 267, "eos from config");
        ds41_tokenizer_free(t);
    }
}

/* Added-token ids are assigned as Hugging Face does on load: a content found in model.vocab
 * takes that id, others the next id past max(vocab entry count, largest added id). */
static void test_added_ids_as_hf(void) {
    json_t *j = mini_json();
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "zz", json_integer(1000));
    json_t *added = json_object_get(j, "added_tokens");
    json_array_insert_new(added, 0, json_pack("{s:i,s:s,s:b}", "id", 1000, "content", "zz", "special", 0));
    char *p = write_json("holes.json", j);
    json_decref(j);
    ds41_tokenizer *t = NULL;
    ds41_err err;
    int level = ds41_log_level;
    ds41_log_level = 0;  /* the id mismatch warnings are expected here */
    int rc = ds41_tokenizer_load(p, &t, &err);
    ds41_log_level = level;
    CHECK(rc == 0, "load: %s", err.msg);
    if (!t) return;
    CHECK(ds41_token_id(t, "zz") == 1000, "zz keeps its vocab id");
    CHECK(ds41_token_id(t, "<s>") == 1001 && ds41_token_id(t, "<tool>") == 1002 && ds41_token_id(t, "<ls>") == 1003,
          "then 1001.. (<s> %d)", ds41_token_id(t, "<s>"));
    CHECK(ds41_tokenizer_vocab_size(t) == 1004, "vocab size %d", ds41_tokenizer_vocab_size(t));
    int32_t *ids;
    size_t k;
    CHECK(ds41_tokenize(t, "zz<s>", 5, 1, 0, &ids, &k, &err) == 0 && k == 2 && ids[0] == 1000 && ids[1] == 1001, "encode");
    free(ids);
    ds41_tokenizer_free(t);
}

static void test_engram_map(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/em", tmpdir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && rm -f %s/engram_token_map.i32", dir, dir);
    CHECK(system(cmd) == 0, "mkdir");
    int32_t *map;
    int nc;
    ds41_err err;
    /* vocab 300 > the tokenizer's 268: ids past it decode to "" and share one key */
    CHECK(ds41_engram_token_map(dir, mini, 300, &map, &nc, &err) == 0, "build: %s", err.msg);
    if (map) {
        CHECK(map['A'] == map['a'], "A and a share a compressed id");
        CHECK(map[' '] != map['a'], "space is its own (protected lone space)");
        CHECK(map[268] == map[299] && map[268] != map['a'], "unknown ids share the empty key");
        CHECK(map[0xe4] != map[0xe5], "partial UTF-8 bytes keyed by their raw vocab strings");
        CHECK(map[0] == 0, "first id numbered 0");
        free(map);
    }
    /* cached: the file is used as is */
    char path[1024];
    snprintf(path, sizeof path, "%s/engram_token_map.i32", dir);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cache file written");
    if (f) {
        fseek(f, 0, SEEK_END);
        CHECK(ftell(f) == 1200, "cache size %ld", ftell(f));
        fclose(f);
    }
    int32_t custom[300];
    for (int i = 0; i < 300; i++) custom[i] = i % 7;
    write_text("em/engram_token_map.i32", (const char *)custom, sizeof custom);
    CHECK(ds41_engram_token_map(dir, mini, 300, &map, &nc, &err) == 0 && nc == 7 && map[12] == 5, "cached map used as is");
    free(map);
    CHECK(ds41_engram_token_map(dir, mini, 299, &map, &nc, &err) == -1 && strstr(err.msg, "expected 1196"), "wrong size: %s", err.msg);
    custom[17] = -4;
    write_text("em/engram_token_map.i32", (const char *)custom, sizeof custom);
    CHECK(ds41_engram_token_map(dir, mini, 300, &map, &nc, &err) == -1 && strstr(err.msg, "entry 17"), "bad entry: %s", err.msg);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ds41_test_tokenizer_%ld", (long)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd) != 0) return 1;
    json_t *j = mini_json();
    char *p = write_json("tokenizer.json", j);
    json_decref(j);
    ds41_err err;
    if (ds41_tokenizer_load(p, &mini, &err)) {
        printf("FAIL mini_tokenizer_loads: %s\n", err.msg);
        return 1;
    }
    RUN_CASE(test_load);
    RUN_CASE(test_encode_exact);
    RUN_CASE(test_empty_and_special_only);
    RUN_CASE(test_nul_bytes);
    RUN_CASE(test_invalid_utf8);
    RUN_CASE(test_detokenize);
    RUN_CASE(test_stream);
    RUN_CASE(test_ten_mb_line);
    RUN_CASE(test_bad_files);
    RUN_CASE(test_added_ids_as_hf);
    RUN_CASE(test_engram_map);
    ds41_tokenizer_free(mini);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return check_exit();
}
