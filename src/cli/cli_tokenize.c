/* ds41 tokenize: text to token ids and back, with the checkpoint's own tokenizer.json.
 * Also the batch modes the conformance tests drive (one process over a whole corpus). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "config.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fputs("usage: ds41 tokenize -m DIR|tokenizer.json [options] TEXT|-\n"
          "       ds41 tokenize -m DIR --decode ID,ID,...|-\n"
          "\n"
          "Encodes TEXT (or standard input with -) to token ids and prints them on one line,\n"
          "separated by spaces. -m takes a checkpoint directory holding tokenizer.json (and\n"
          "tokenizer_config.json, read for add_bos_token) or the tokenizer.json path itself.\n"
          "Invalid UTF-8 input is not an error: each invalid sequence is read as U+FFFD.\n"
          "\n"
          "options:\n"
          "  --json            print {\"ids\":[...],\"tokens\":[...],\"pieces\":[...]} (tokens: vocabulary\n"
          "                    strings; pieces: the text of each token, lossy where a token is part\n"
          "                    of a character)\n"
          "  --no-special      do not match special-token text (split_special_tokens=True)\n"
          "  --no-bos          do not apply the post-processor (no BOS/EOS)\n"
          "  --decode LIST     decode comma/space separated ids (- reads them from stdin)\n"
          "  --skip-special    with --decode: drop special tokens\n"
          "  --batch FILE      JSON lines (a string, or {\"hex\": \"...\"} for raw bytes) -> one line\n"
          "                    each: {\"sp\":ids,\"ns\":ids without special matching,\"bos\":ids with\n"
          "                    the post-processor,\"rt\":decode(ids) == the lossy text}\n"
          "  --decode-each     print decode([id]) of every id, one JSON string per line\n"
          "  --engram-map      build (or load) DIR/engram_token_map.i32 and print its size\n"
          "  --vocab-size N    with --decode-each / --engram-map: ids 0..N-1 (default: the\n"
          "                    tokenizer's largest id + 1; for --engram-map the vocab_size of\n"
          "                    DIR/config.json when DIR has one)\n"
          "  --                the next argument is TEXT even if it starts with '-'\n"
          "  -h, --help        this text\n",
          f);
}

/* A JSON string exactly as JavaScript's JSON.stringify writes it, so the test can compare
 * ds41's output with the oracle's byte for byte. s is valid UTF-8. */
static void put_json_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
    }
    fputc('"', f);
}

static void put_ids(FILE *f, const int32_t *ids, size_t n, const char *sep) {
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? sep : "", ids[i]);
}

static int read_all(FILE *in, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return -1;
    for (;;) {
        if (n == cap) {
            char *p = cap > ((size_t)1 << 40) ? NULL : realloc(buf, 2 * cap + 1);
            if (!p) { free(buf); return -1; }
            buf = p;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, in);
        n += k;
        if (k == 0) break;
    }
    if (ferror(in)) { free(buf); return -1; }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            fprintf(stderr, "ds41 tokenize: --decode: '%.20s' is not a token id (a non-negative integer)\n", p);
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *q = realloc(v, 2 * cap * sizeof *q);
            if (!q) { free(v); return -1; }
            v = q;
            cap *= 2;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int hex_bytes(const char *h, char **out, size_t *n) {
    size_t l = strlen(h);
    if (l % 2) return -1;
    char *b = malloc(l / 2 + 1);
    if (!b) return -1;
    for (size_t i = 0; i < l / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) { free(b); return -1; }
        b[i] = (char)v;
    }
    *out = b;
    *n = l / 2;
    return 0;
}

static int batch(const ds41_tokenizer *tok, const char *file) {
    FILE *f = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    if (!f) { fprintf(stderr, "ds41 tokenize: %s: %s\n", file, strerror(errno)); return 1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    ds41_err err = {0};
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        json_error_t je;
        json_t *v = json_loadb(line, (size_t)len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        char *text = NULL;
        size_t n = 0;
        if (json_is_string(v)) {
            n = json_string_length(v);
            text = malloc(n + 1);
            if (text) memcpy(text, json_string_value(v), n);
        } else if (json_is_string(json_object_get(v, "hex"))) {
            if (hex_bytes(json_string_value(json_object_get(v, "hex")), &text, &n)) text = NULL;
        }
        json_decref(v);
        if (!text) {
            fprintf(stderr, "ds41 tokenize: %s:%ld: expected a JSON string or {\"hex\": \"...\"}\n", file, lineno);
            rc = 1;
            break;
        }
        int32_t *a[3] = { NULL, NULL, NULL };
        size_t na[3];
        static const int mode[3][2] = { { 1, 0 }, { 0, 0 }, { 1, 1 } };
        for (int k = 0; k < 3 && !rc; k++)
            if (ds41_tokenize(tok, text, n, mode[k][0], mode[k][1], &a[k], &na[k], &err)) rc = 1;
        int rt = 0;
        if (!rc) {
            size_t ln, d0n, d1n;
            char *lossy = ds41_utf8_lossy(text, n, &ln), *d0 = NULL, *d1 = NULL;
            if (!lossy || ds41_detokenize(tok, a[0], na[0], 0, &d0, &d0n, &err) ||
                ds41_detokenize(tok, a[1], na[1], 0, &d1, &d1n, &err))
                rc = 1;
            else
                rt = d0n == ln && d1n == ln && !memcmp(d0, lossy, ln) && !memcmp(d1, lossy, ln);
            free(lossy); free(d0); free(d1);
        }
        if (!rc) {
            fputs("{\"sp\":[", stdout);
            put_ids(stdout, a[0], na[0], ",");
            fputs("],\"ns\":[", stdout);
            put_ids(stdout, a[1], na[1], ",");
            fputs("],\"bos\":[", stdout);
            put_ids(stdout, a[2], na[2], ",");
            printf("],\"rt\":%s}\n", rt ? "true" : "false");
        } else {
            fprintf(stderr, "ds41 tokenize: %s:%ld: %s\n", file, lineno, err.msg[0] ? err.msg : "out of memory");
        }
        for (int k = 0; k < 3; k++) free(a[k]);
        free(text);
        if (rc) break;
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

static int decode_each(const ds41_tokenizer *tok, int vocab_size) {
    ds41_err err;
    for (int32_t id = 0; id < vocab_size; id++) {
        char *t;
        size_t n;
        if (ds41_detokenize(tok, &id, 1, 0, &t, &n, &err)) {
            fprintf(stderr, "ds41 tokenize: %s\n", err.msg);
            return 1;
        }
        put_json_str(stdout, t, n);
        fputc('\n', stdout);
        free(t);
    }
    return 0;
}

/* The directory -m names: itself, or the one holding the tokenizer.json it names. */
static char *model_dir(const char *model) {
    struct stat st;
    char *dir = strdup(model);
    if (!dir || (stat(model, &st) == 0 && S_ISDIR(st.st_mode))) return dir;
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else strcpy(dir, ".");
    return dir;
}

static int engram_map(const char *model, const ds41_tokenizer *tok, int vocab_size) {
    char *dir = model_dir(model);
    if (!dir) return 1;
    int32_t *map;
    int nc;
    ds41_err err;
    int rc = ds41_engram_token_map(dir, tok, vocab_size, &map, &nc, &err);
    char *path = ds41_path_join(dir, "engram_token_map.i32");
    if (rc) fprintf(stderr, "ds41 tokenize: %s\n", err.msg);
    else printf("engram token map: %d ids -> %d compressed ids (%s)\n", vocab_size, nc, path ? path : dir);
    if (!rc) free(map);
    free(path);
    free(dir);
    return rc ? 1 : 0;
}

static int file_in(const char *dir, const char *name) {
    char *p = ds41_path_join(dir, name);
    struct stat st;
    int ok = p && stat(p, &st) == 0;
    free(p);
    return ok;
}

int ds41_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *decode = NULL, *batch_file = NULL;
    int json = 0, special = 1, bos = 1, skip_special = 0, each = 0, emap = 0, vocab_size = 0, opts_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        /* after "--" every argument is TEXT, so text starting with '-' can be encoded */
        if (opts_done || !strcmp(a, "--")) {
            if (!opts_done) { opts_done = 1; continue; }
            if (text) { fprintf(stderr, "ds41 tokenize: more than one TEXT argument (quote it)\n"); return 2; }
            text = a;
        }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-special")) special = 0;
        else if (!strcmp(a, "--no-bos")) bos = 0;
        else if (!strcmp(a, "--skip-special")) skip_special = 1;
        else if (!strcmp(a, "--decode") && i + 1 < argc) decode = argv[++i];
        else if (!strcmp(a, "--batch") && i + 1 < argc) batch_file = argv[++i];
        else if (!strcmp(a, "--decode-each")) each = 1;
        else if (!strcmp(a, "--engram-map")) emap = 1;
        else if (!strcmp(a, "--vocab-size") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v <= 0 || v > (1 << 24)) {
                fprintf(stderr, "ds41 tokenize: --vocab-size: expected a positive integer, got '%s'\n", argv[i]);
                return 2;
            }
            vocab_size = (int)v;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ds41 tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!text) text = a;
        else { fprintf(stderr, "ds41 tokenize: more than one TEXT argument (quote it)\n"); return 2; }
    }
    if (!model) { fprintf(stderr, "ds41 tokenize: -m DIR|tokenizer.json is required\n"); usage(stderr); return 2; }
    int modes = !!decode + !!batch_file + each + emap + !!text;
    if (modes != 1) {
        fprintf(stderr, "ds41 tokenize: give exactly one of TEXT, -, --decode, --batch, --decode-each, --engram-map\n");
        return 2;
    }
    ds41_tokenizer *tok;
    ds41_err err;
    if (ds41_tokenizer_load(model, &tok, &err)) {
        fprintf(stderr, "ds41 tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (!vocab_size && emap) {
        /* the map must have one entry per id of the model's (padded) vocabulary, as ds41 run
         * reads it: take the size from DIR/config.json when there is one */
        char *dir = model_dir(model);
        ds41_config cfg;
        int bad = !dir;
        if (dir && file_in(dir, "config.json")) {
            if (ds41_config_load(dir, &cfg, &err)) {
                fprintf(stderr, "ds41 tokenize: %s\n", err.msg);
                bad = 1;
            } else {
                vocab_size = cfg.vocab_size;
                ds41_config_free(&cfg);
            }
        }
        free(dir);
        if (bad) { ds41_tokenizer_free(tok); return 1; }
    }
    if (!vocab_size) vocab_size = ds41_tokenizer_vocab_size(tok);
    if (batch_file) rc = batch(tok, batch_file);
    else if (each) rc = decode_each(tok, vocab_size);
    else if (emap) rc = engram_map(model, tok, vocab_size);
    else if (decode) {
        char *src = NULL, *out = NULL;
        size_t n, on;
        int32_t *ids = NULL;
        if (!strcmp(decode, "-") && read_all(stdin, &src, &n)) { fprintf(stderr, "ds41 tokenize: cannot read stdin\n"); rc = 1; }
        else if (parse_ids(src ? src : decode, &ids, &n)) rc = 1;
        else if (ds41_detokenize(tok, ids, n, skip_special, &out, &on, &err)) { fprintf(stderr, "ds41 tokenize: %s\n", err.msg); rc = 1; }
        else {
            if (json) { put_json_str(stdout, out, on); fputc('\n', stdout); }
            else fwrite(out, 1, on, stdout);
        }
        free(src); free(ids); free(out);
    } else {
        char *buf = NULL;
        size_t n;
        int32_t *ids = NULL;
        if (!strcmp(text, "-")) {
            if (read_all(stdin, &buf, &n)) { fprintf(stderr, "ds41 tokenize: cannot read stdin\n"); rc = 1; }
        } else {
            n = strlen(text);
        }
        if (!rc && ds41_tokenize(tok, buf ? buf : text, n, special, bos, &ids, &n, &err)) {
            fprintf(stderr, "ds41 tokenize: %s\n", err.msg);
            rc = 1;
        }
        if (!rc && !json) {
            put_ids(stdout, ids, n, " ");
            fputc('\n', stdout);
        } else if (!rc) {
            fputs("{\"ids\":[", stdout);
            put_ids(stdout, ids, n, ",");
            fputs("],\"tokens\":[", stdout);
            for (size_t i = 0; i < n; i++) {
                const char *s = ds41_token_str(tok, ids[i]);
                if (i) fputc(',', stdout);
                put_json_str(stdout, s ? s : "", s ? strlen(s) : 0);
            }
            fputs("],\"pieces\":[", stdout);
            for (size_t i = 0; i < n && !rc; i++) {
                char *p;
                size_t pn;
                if (ds41_detokenize(tok, &ids[i], 1, 0, &p, &pn, &err)) { rc = 1; break; }
                if (i) fputc(',', stdout);
                put_json_str(stdout, p, pn);
                free(p);
            }
            fputs("]}\n", stdout);
        }
        free(buf);
        free(ids);
    }
    ds41_tokenizer_free(tok);
    if (fflush(stdout)) rc = 1;
    return rc;
}
