/* ds41 cache: look inside a persistent prefix store directory (src/store/pstore.h): list its
 * blocks, sum them per model fingerprint, verify every file's checksums, clear it. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "pstore.h"

static void usage(FILE *f) {
    fputs("usage: ds41 cache ls|stats|verify|clear --cache-dir DIR [options]\n"
          "\n"
          "Looks inside the persistent prefix store that ds41 run / ds41 serve --cache-dir DIR keep\n"
          "(one file per 128-token block, one subdirectory per model fingerprint).\n"
          "\n"
          "  ls       one line per block: fingerprint (first 16 hex digits), key, parent key, tokens,\n"
          "           file bytes, time since last use\n"
          "  stats    blocks, bytes and tokens, in all and per fingerprint; leftover temporary files\n"
          "           and files whose header is damaged\n"
          "  verify   reads every file and checks its size and both checksums; lists the damaged ones,\n"
          "           other format versions and temporary files\n"
          "  clear    removes every block (and leftover temporary file)\n"
          "\n"
          "options:\n"
          "  --cache-dir DIR     the store directory (required)\n"
          "  --fingerprint HEX   only the blocks of this model fingerprint (its 64 hex digits, or a\n"
          "                      prefix that matches one fingerprint directory)\n"
          "  --fix               verify: remove damaged, other-version and orphaned temporary files,\n"
          "                      under the store's exclusive lock (writers wait meanwhile)\n"
          "  --json              one JSON object on stdout\n"
          "  -h, --help          this help\n"
          "\n"
          "Exit status: 0 ok; 1 the directory cannot be read, verify found damaged files (and --fix\n"
          "did not remove them all), or --fingerprint matches no directory (one line on stderr naming\n"
          "it); 2 bad usage.\n",
          f);
}

/* ---- collecting the scan ---------------------------------------------------------------- */

typedef struct item {
    char *path, *why;
    int kind, removed;
    uint8_t fp[32], key[16], parent[16];
    uint32_t n_ids;
    uint64_t n_payload, file_bytes;
    long long mtime_ns;
} item;

typedef struct items { item *v; size_t n, cap; } items;

static int collect(const ds41_pstore_info *in, void *ctx) {
    items *l = ctx;
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 256;
        item *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return -2;
        l->v = nv;
        l->cap = nc;
    }
    item *it = &l->v[l->n];
    memset(it, 0, sizeof *it);
    it->path = strdup(in->path);
    it->why = strdup(in->why ? in->why : "");
    if (!it->path || !it->why) { free(it->path); free(it->why); return -2; }
    it->kind = in->kind;
    it->removed = in->removed;
    memcpy(it->fp, in->fingerprint, 32);
    memcpy(it->key, in->key, 16);
    memcpy(it->parent, in->parent, 16);
    it->n_ids = in->n_ids;
    it->n_payload = in->n_payload;
    it->file_bytes = in->file_bytes;
    it->mtime_ns = in->mtime_ns;
    l->n++;
    return 0;
}

static void items_free(items *l) {
    for (size_t i = 0; i < l->n; i++) { free(l->v[i].path); free(l->v[i].why); }
    free(l->v);
}

static const char *kind_name(int k) {
    switch (k) {
    case DS41_PSTORE_OK: return "ok";
    case DS41_PSTORE_DAMAGED: return "damaged";
    case DS41_PSTORE_FOREIGN: return "other-version";
    default: return "temporary";
    }
}

static double age_s(long long mtime_ns) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    double now = (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
    double a = now - 1e-9 * (double)mtime_ns;
    return a < 0 ? 0 : a;
}

static void fmt_age(double a, char *buf, size_t cap) {
    if (a < 120) snprintf(buf, cap, "%.0fs", a);
    else if (a < 7200) snprintf(buf, cap, "%.0fm", a / 60);
    else if (a < 172800) snprintf(buf, cap, "%.0fh", a / 3600);
    else snprintf(buf, cap, "%.0fd", a / 86400);
}

static json_t *hex_json(const uint8_t *v, size_t n) {
    char h[129];
    ds41_pstore_hex(v, n, h);
    return json_string(h);
}

static int print_json(json_t *o) {
    if (!o) return 1;
    int rc = json_dumpf(o, stdout, JSON_INDENT(2)) == 0 ? 0 : 1;
    fputc('\n', stdout);
    json_decref(o);
    return rc;
}

/* --fingerprint: 0 found (*fp set), 1 no directory matches, 2 several match, -1 dir unreadable */
static int resolve_fingerprint(const char *dir, const char *prefix, uint8_t fp[32], int *matches) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    size_t pl = strlen(prefix);
    char found[65] = "";
    *matches = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (strlen(nm) != 64 || strncasecmp(nm, prefix, pl) != 0) continue;
        if (ds41_pstore_unhex(nm, fp, 32) != 0) continue;
        if (*matches == 0 || strcmp(nm, found) != 0) {
            (*matches)++;
            memcpy(found, nm, 65);   /* 64 digits and the NUL */
        }
    }
    closedir(d);
    if (*matches == 0) return 1;
    if (*matches > 1) return 2;
    return ds41_pstore_unhex(found, fp, 32) == 0 ? 0 : 1;
}

/* ---- the subcommands ------------------------------------------------------------------- */

static int cmd_ls(const char *dir, const items *l, int json) {
    size_t skipped = 0;
    if (json) {
        json_t *o = json_object(), *arr = json_array();
        json_object_set_new(o, "dir", json_string(dir));
        for (size_t i = 0; i < l->n; i++) {
            const item *it = &l->v[i];
            if (it->kind != DS41_PSTORE_OK) { skipped++; continue; }
            json_t *b = json_object();
            json_object_set_new(b, "fingerprint", hex_json(it->fp, 32));
            json_object_set_new(b, "key", hex_json(it->key, 16));
            json_object_set_new(b, "parent", hex_json(it->parent, 16));
            json_object_set_new(b, "tokens", json_integer(it->n_ids));
            json_object_set_new(b, "payload_bytes", json_integer((json_int_t)it->n_payload));
            json_object_set_new(b, "file_bytes", json_integer((json_int_t)it->file_bytes));
            json_object_set_new(b, "age_s", json_real(age_s(it->mtime_ns)));
            json_object_set_new(b, "path", json_string(it->path));
            json_array_append_new(arr, b);
        }
        json_object_set_new(o, "blocks", arr);
        json_object_set_new(o, "not_listed", json_integer((json_int_t)skipped));
        if (print_json(o)) return 1;
    } else {
        printf("%-16s  %-32s  %-32s  %6s  %10s  %s\n", "fingerprint", "key", "parent", "tokens", "bytes", "age");
        for (size_t i = 0; i < l->n; i++) {
            const item *it = &l->v[i];
            if (it->kind != DS41_PSTORE_OK) { skipped++; continue; }
            char fp[65], key[33], parent[33], age[32];
            ds41_pstore_hex(it->fp, 32, fp);
            ds41_pstore_hex(it->key, 16, key);
            ds41_pstore_hex(it->parent, 16, parent);
            fmt_age(age_s(it->mtime_ns), age, sizeof age);
            printf("%.16s  %s  %s  %6u  %10llu  %s\n", fp, key, parent, it->n_ids, (unsigned long long)it->file_bytes, age);
        }
    }
    if (skipped)
        fprintf(stderr, "ds41 cache ls: %zu file(s) in %s not listed (damaged header, other version or temporary; "
                "see ds41 cache verify)\n", skipped, dir);
    return 0;
}

typedef struct fp_sum { uint8_t fp[32]; long long blocks, bytes, payload, tokens; } fp_sum;

static int cmd_stats(const char *dir, const items *l, int json) {
    fp_sum *f = calloc(l->n ? l->n : 1, sizeof *f);
    if (!f) { fprintf(stderr, "ds41 cache stats: out of memory\n"); return 1; }
    size_t nf = 0;
    long long blocks = 0, bytes = 0, payload = 0, tokens = 0, temp = 0, damaged = 0, foreign = 0;
    for (size_t i = 0; i < l->n; i++) {
        const item *it = &l->v[i];
        if (it->kind == DS41_PSTORE_TEMP) { temp++; continue; }
        if (it->kind == DS41_PSTORE_DAMAGED) { damaged++; continue; }
        if (it->kind == DS41_PSTORE_FOREIGN) { foreign++; continue; }
        if (!nf || memcmp(f[nf - 1].fp, it->fp, 32) != 0) memcpy(f[nf++].fp, it->fp, 32);   /* scan is sorted */
        fp_sum *s = &f[nf - 1];
        s->blocks++;
        s->bytes += (long long)it->file_bytes;
        s->payload += (long long)it->n_payload;
        s->tokens += it->n_ids;
        blocks++;
        bytes += (long long)it->file_bytes;
        payload += (long long)it->n_payload;
        tokens += it->n_ids;
    }
    int rc = 0;
    if (json) {
        json_t *o = json_object(), *arr = json_array();
        json_object_set_new(o, "dir", json_string(dir));
        json_object_set_new(o, "blocks", json_integer(blocks));
        json_object_set_new(o, "bytes", json_integer(bytes));
        json_object_set_new(o, "payload_bytes", json_integer(payload));
        json_object_set_new(o, "tokens", json_integer(tokens));
        json_object_set_new(o, "temp_files", json_integer(temp));
        json_object_set_new(o, "damaged_headers", json_integer(damaged));
        json_object_set_new(o, "other_versions", json_integer(foreign));
        for (size_t i = 0; i < nf; i++) {
            json_t *b = json_object();
            json_object_set_new(b, "fingerprint", hex_json(f[i].fp, 32));
            json_object_set_new(b, "blocks", json_integer(f[i].blocks));
            json_object_set_new(b, "bytes", json_integer(f[i].bytes));
            json_object_set_new(b, "payload_bytes", json_integer(f[i].payload));
            json_object_set_new(b, "tokens", json_integer(f[i].tokens));
            json_array_append_new(arr, b);
        }
        json_object_set_new(o, "fingerprints", arr);
        rc = print_json(o);
    } else {
        printf("dir             %s\n", dir);
        printf("blocks          %lld\n", blocks);
        printf("bytes           %lld (payload %lld)\n", bytes, payload);
        printf("tokens          %lld\n", tokens);
        printf("fingerprints    %zu\n", nf);
        for (size_t i = 0; i < nf; i++) {
            char h[65];
            ds41_pstore_hex(f[i].fp, 32, h);
            printf("  %s  %lld blocks, %lld bytes, %lld tokens\n", h, f[i].blocks, f[i].bytes, f[i].tokens);
        }
        printf("temporary files %lld\n", temp);
        printf("damaged headers %lld\n", damaged);
        printf("other versions  %lld\n", foreign);
    }
    free(f);
    return rc;
}

static int cmd_verify(const char *dir, const items *l, int json, int fix) {
    long long ok = 0, damaged = 0, foreign = 0, temp = 0, removed = 0, unfixed = 0;
    const item *first_bad = NULL;
    json_t *o = NULL, *arr = NULL;
    if (json) {
        o = json_object();
        arr = json_array();
    }
    for (size_t i = 0; i < l->n; i++) {
        const item *it = &l->v[i];
        if (it->kind == DS41_PSTORE_OK) { ok++; continue; }
        if (it->kind == DS41_PSTORE_DAMAGED) damaged++;
        else if (it->kind == DS41_PSTORE_FOREIGN) foreign++;
        else temp++;
        if (it->removed) removed++;
        if (it->kind != DS41_PSTORE_TEMP && !it->removed) {
            unfixed++;
            if (!first_bad) first_bad = it;
        }
        if (json) {
            json_t *b = json_object();
            json_object_set_new(b, "path", json_string(it->path));
            json_object_set_new(b, "kind", json_string(kind_name(it->kind)));
            json_object_set_new(b, "why", it->kind == DS41_PSTORE_TEMP ? json_null() : json_string(it->why));
            json_object_set_new(b, "removed", json_boolean(it->removed));
            json_array_append_new(arr, b);
        } else if (it->kind == DS41_PSTORE_TEMP) {
            printf("%stemporary  %s%s\n", it->removed ? "removed " : "", it->path,
                   fix ? "" : " (a write in progress, or left by a killed writer: --fix removes it)");
        } else {
            printf("%s%-9s  %s: %s\n", it->removed ? "removed " : "", kind_name(it->kind), it->path, it->why);
        }
    }
    int rc = 0;
    if (json) {
        json_object_set_new(o, "dir", json_string(dir));
        json_object_set_new(o, "files", json_integer((json_int_t)l->n));
        json_object_set_new(o, "ok", json_integer(ok));
        json_object_set_new(o, "damaged", json_integer(damaged));
        json_object_set_new(o, "other_versions", json_integer(foreign));
        json_object_set_new(o, "temp_files", json_integer(temp));
        json_object_set_new(o, "removed", json_integer(removed));
        json_object_set_new(o, "problems", arr);
        rc = print_json(o);
    } else {
        printf("verified %zu files in %s: %lld ok, %lld damaged, %lld other version, %lld temporary",
               l->n, dir, ok, damaged, foreign, temp);
        if (fix) printf(", %lld removed", removed);
        printf("\n");
    }
    if (unfixed) {
        fprintf(stderr, "ds41 cache verify: %s: %s%s\n", first_bad->path, first_bad->why,
                unfixed > 1 ? " (and more damaged files, listed on stdout)" : "");
        return 1;
    }
    return rc;
}

int ds41_cli_cache(int argc, char **argv) {
    const char *sub = NULL, *dir = NULL, *fphex = NULL;
    int json = 0, fix = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--fix")) {
            fix = 1;
        } else if (!strcmp(a, "--cache-dir") || !strcmp(a, "--fingerprint")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ds41 cache: %s needs a value\n", a);
                return 2;
            }
            if (!strcmp(a, "--cache-dir")) dir = argv[++i];
            else fphex = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "ds41 cache: unknown option '%s' (ds41 cache --help)\n", a);
            return 2;
        } else if (!sub) {
            sub = a;
        } else {
            fprintf(stderr, "ds41 cache: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!sub) {
        fprintf(stderr, "ds41 cache: missing subcommand: ls, stats, verify or clear (ds41 cache --help)\n");
        return 2;
    }
    int is_ls = !strcmp(sub, "ls"), is_stats = !strcmp(sub, "stats"), is_verify = !strcmp(sub, "verify"),
        is_clear = !strcmp(sub, "clear");
    if (!is_ls && !is_stats && !is_verify && !is_clear) {
        fprintf(stderr, "ds41 cache: unknown subcommand '%s': ls, stats, verify or clear\n", sub);
        return 2;
    }
    if (!dir || !*dir) {
        fprintf(stderr, "ds41 cache %s: --cache-dir DIR is required\n", sub);
        return 2;
    }
    if (fix && !is_verify) {
        fprintf(stderr, "ds41 cache %s: --fix is an option of verify only\n", sub);
        return 2;
    }
    uint8_t fp[32];
    const uint8_t *fpp = NULL;
    if (fphex) {
        size_t n = strlen(fphex);
        int hex = n >= 1 && n <= 64;
        for (size_t i = 0; hex && i < n; i++) hex = isxdigit((unsigned char)fphex[i]) != 0;
        if (!hex) {
            fprintf(stderr, "ds41 cache %s: --fingerprint: '%s' is not 1 to 64 hex digits\n", sub, fphex);
            return 2;
        }
        int matches = 0;
        int r = resolve_fingerprint(dir, fphex, fp, &matches);
        if (r < 0) {
            fprintf(stderr, "ds41 cache %s: %s: %s\n", sub, dir, strerror(errno));
            return 1;
        }
        if (r == 1) {
            fprintf(stderr, "ds41 cache %s: --fingerprint %s: no fingerprint directory of %s matches\n", sub, fphex, dir);
            return 1;
        }
        if (r == 2) {
            fprintf(stderr, "ds41 cache %s: --fingerprint %s: matches %d fingerprint directories of %s; give more digits\n",
                    sub, fphex, matches, dir);
            return 2;
        }
        fpp = fp;
    }
    ds41_err err;
    err.msg[0] = 0;
    if (is_clear) {
        long long blocks = 0, bytes = 0;
        if (ds41_pstore_clear(dir, fpp, &blocks, &bytes, &err) != 0) {
            fprintf(stderr, "ds41 cache clear: %s\n", err.msg);
            return 1;
        }
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "dir", json_string(dir));
            json_object_set_new(o, "removed_blocks", json_integer(blocks));
            json_object_set_new(o, "removed_bytes", json_integer(bytes));
            return print_json(o);
        }
        printf("removed %lld blocks (%lld bytes) from %s\n", blocks, bytes, dir);
        return 0;
    }
    unsigned flags = is_verify ? DS41_PSTORE_SCAN_FULL | (fix ? DS41_PSTORE_SCAN_FIX : 0) : 0;
    items l = { 0 };
    int r = ds41_pstore_scan(dir, fpp, flags, collect, &l, &err);
    if (r != 0) {
        if (r == -2) fprintf(stderr, "ds41 cache %s: out of memory listing %s\n", sub, dir);
        else fprintf(stderr, "ds41 cache %s: %s\n", sub, err.msg);
        items_free(&l);
        return 1;
    }
    int rc = is_ls ? cmd_ls(dir, &l, json) : is_stats ? cmd_stats(dir, &l, json) : cmd_verify(dir, &l, json, fix);
    items_free(&l);
    return rc;
}
