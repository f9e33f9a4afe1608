/* Tests for src/format/safetensors.c: dtype table, valid single / directory / sharded
 * checkpoints written here (exact dtype, shape, offset and data pointer values),
 * in-memory images, many tensors, the malformed corpus tests/malformed/st/, and a
 * mincore() check that opening touches no tensor data. */
#define _GNU_SOURCE
#include "check.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char tmp_root[4096];

static const char *root_dir(void) {
    const char *r = getenv("DS41_ROOT");
    return r && r[0] ? r : ".";
}

static void make_tmp_root(void) {
    const char *t = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/ds41-st-XXXXXX", t && t[0] ? t : "/tmp");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        exit(1);
    }
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static char *tmp_path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", tmp_root, name);
    return out;
}

/* Writes 8-byte length + header (space-padded so the data section starts at a
 * multiple of 8) + data. Returns the data section's file offset. */
static uint64_t write_st(const char *path, const char *header, const void *data, size_t len) {
    size_t h = strlen(header);
    size_t padded = h + (8 - (8 + h) % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(lenb, 1, 8, f);
    fwrite(header, 1, h, f);
    for (size_t i = h; i < padded; i++) fputc(' ', f);
    if (len) fwrite(data, 1, len, f);
    fclose(f);
    return 8 + padded;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static void fill_pattern(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 131u + seed * 17u + 7u);
}

/* Mapping base = data pointer minus its file offset; the mapping is page-aligned,
 * so the pointer's offset within a page must equal the file offset's. */
static int at_file_offset(const ds41_tensor *t, uint64_t off) {
    long pg = sysconf(_SC_PAGESIZE);
    return (uintptr_t)t->data % (uintptr_t)pg == off % (uint64_t)pg;
}

/* ------------------------------------------------------------------ dtypes */

static void test_dtypes(void) {
    static const struct { const char *n; int sz; ds41_dtype dt; } want[] = {
        {"BF16", 2, DS41_DT_BF16}, {"F16", 2, DS41_DT_F16}, {"F32", 4, DS41_DT_F32},
        {"F64", 8, DS41_DT_F64}, {"F8_E4M3", 1, DS41_DT_F8_E4M3}, {"F8_E5M2", 1, DS41_DT_F8_E5M2},
        {"F8_E8M0", 1, DS41_DT_F8_E8M0}, {"I8", 1, DS41_DT_I8}, {"U8", 1, DS41_DT_U8},
        {"I16", 2, DS41_DT_I16}, {"U16", 2, DS41_DT_U16}, {"I32", 4, DS41_DT_I32},
        {"U32", 4, DS41_DT_U32}, {"I64", 8, DS41_DT_I64}, {"U64", 8, DS41_DT_U64},
        {"BOOL", 1, DS41_DT_BOOL},
    };
    CHECK(sizeof want / sizeof want[0] == DS41_DT_COUNT, "table covers %d dtypes", DS41_DT_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ds41_dtype dt = DS41_DT_COUNT;
        CHECK(ds41_dtype_parse(want[i].n, &dt) == 0 && dt == want[i].dt, "parse %s", want[i].n);
        CHECK(strcmp(ds41_dtype_name(want[i].dt), want[i].n) == 0, "name of %s", want[i].n);
        CHECK(ds41_dtype_size(want[i].dt) == want[i].sz, "size of %s", want[i].n);
    }
    ds41_dtype dt;
    CHECK(ds41_dtype_parse("bf16", &dt) == -1, "dtype names are case-sensitive");
    CHECK(ds41_dtype_parse("", &dt) == -1, "empty dtype");
    CHECK(ds41_dtype_parse("F8_E4M3FN", &dt) == -1, "no prefix match");
    CHECK(strcmp(ds41_dtype_name(DS41_DT_COUNT), "?") == 0, "out-of-range name");
    CHECK(ds41_dtype_size(DS41_DT_COUNT) == 0, "out-of-range size");
}

/* ------------------------------------------------------------------ valid files */

/* b F32 [2, 3] at [0, 24); a BF16 [4] at [24, 32); c I8 [] at [32, 33);
 * e U8 [0, 5] at [33, 33) (empty); listed out of name order on purpose. */
static const char *HDR3 =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"e\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[33,33]},"
    "\"c\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[32,33]}}";

/* exact_b: the exact address b's data must have (buffers), or NULL to check the
 * file offset doff against the page-aligned mapping. */
static void check_hdr3(ds41_st *st, const uint8_t *data, uint64_t doff, const uint8_t *exact_b,
                       const char *what) {
    CHECK(ds41_st_count(st) == 4, "%s: count %zu", what, ds41_st_count(st));
    if (ds41_st_count(st) != 4) return;
    const ds41_tensor *a = ds41_st_at(st, 0), *b = ds41_st_at(st, 1), *c = ds41_st_at(st, 2),
                      *e = ds41_st_at(st, 3);
    CHECK(!strcmp(a->name, "a") && !strcmp(b->name, "b") && !strcmp(c->name, "c") &&
          !strcmp(e->name, "e"), "%s: sorted by name", what);
    CHECK(ds41_st_at(st, 4) == NULL, "%s: at past the end", what);
    CHECK(a->dtype == DS41_DT_BF16 && a->ndim == 1 && a->shape[0] == 4 && a->nbytes == 8,
          "%s: a fields", what);
    CHECK(b->dtype == DS41_DT_F32 && b->ndim == 2 && b->shape[0] == 2 && b->shape[1] == 3 &&
          b->shape[2] == 0 && b->nbytes == 24, "%s: b fields", what);
    CHECK(c->dtype == DS41_DT_I8 && c->ndim == 0 && c->nbytes == 1, "%s: c scalar", what);
    CHECK(e->dtype == DS41_DT_U8 && e->ndim == 2 && e->shape[0] == 0 && e->shape[1] == 5 &&
          e->nbytes == 0, "%s: e empty", what);
    const uint8_t *b0 = b->data;
    CHECK((const uint8_t *)a->data == b0 + 24 && (const uint8_t *)c->data == b0 + 32 &&
          (const uint8_t *)e->data == b0 + 33, "%s: data pointers relative to b", what);
    if (exact_b) CHECK(b->data == exact_b, "%s: b data pointer", what);
    else CHECK(at_file_offset(b, doff), "%s: b at file offset %llu", what, (unsigned long long)doff);
    CHECK(memcmp(b->data, data, 33) == 0, "%s: data bytes", what);
    CHECK(ds41_st_find(st, "a") == a && ds41_st_find(st, "b") == b && ds41_st_find(st, "c") == c &&
          ds41_st_find(st, "e") == e, "%s: find", what);
    CHECK(!ds41_st_find(st, "d") && !ds41_st_find(st, "") && !ds41_st_find(st, "__metadata__") &&
          !ds41_st_find(st, "aa"), "%s: find absent", what);
    CHECK(a->shard == 0 && b->shard == 0 && c->shard == 0, "%s: shard ids", what);
}


static void test_valid_single(void) {
    uint8_t data[33];
    fill_pattern(data, sizeof data, 1);
    char dir[4200], path[4300];
    mkdir(tmp_path(dir, sizeof dir, "single"), 0700);
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    uint64_t doff = write_st(path, HDR3, data, sizeof data);
    ds41_err err = {{0}};
    ds41_st *st = NULL;

    int rc = ds41_st_open(path, &st, &err);
    CHECK(rc == 0 && st, "open file: %s", err.msg);
    if (st) {
        check_hdr3(st, data, doff, NULL, "file");
        CHECK(ds41_st_shard_count(st) == 1, "shard count");
        CHECK(ds41_st_shard_path(st, 0) && !strcmp(ds41_st_shard_path(st, 0), path), "shard path");
        CHECK(ds41_st_shard_bytes(st, 0) == doff + sizeof data, "shard bytes %llu",
              (unsigned long long)ds41_st_shard_bytes(st, 0));
        CHECK(ds41_st_shard_path(st, 1) == NULL && ds41_st_shard_bytes(st, -1) == 0, "bad shard id");
        ds41_st_close(st);
    }

    /* a directory holding exactly one *.safetensors file (plus unrelated files) */
    char other[4300];
    snprintf(other, sizeof other, "%s/notes.txt", dir);
    write_text(other, "x");
    st = NULL;
    rc = ds41_st_open(dir, &st, &err);
    CHECK(rc == 0 && st, "open dir: %s", err.msg);
    if (st) {
        check_hdr3(st, data, doff, NULL, "dir");
        CHECK(!strcmp(ds41_st_shard_path(st, 0), path), "dir shard path %s", ds41_st_shard_path(st, 0));
        ds41_st_close(st);
    }

    /* two files but one is model.safetensors: that one is the checkpoint */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fill_pattern(data, sizeof data, 2);
    doff = write_st(path, HDR3, data, sizeof data);
    st = NULL;
    rc = ds41_st_open(dir, &st, &err);
    CHECK(rc == 0 && st, "open dir with model.safetensors: %s", err.msg);
    if (st) {
        check_hdr3(st, data, doff, NULL, "model.safetensors");
        CHECK(!strcmp(ds41_st_shard_path(st, 0), path), "picked %s", ds41_st_shard_path(st, 0));
        ds41_st_close(st);
    }
}

static void test_valid_sharded(void) {
    char dir[4200], p1[4300], p2[4300], idx[4300];
    mkdir(tmp_path(dir, sizeof dir, "sharded"), 0700);
    snprintf(p1, sizeof p1, "%s/s-1.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/s-2.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    uint8_t d1[33], d2[24];
    fill_pattern(d1, sizeof d1, 3);
    fill_pattern(d2, sizeof d2, 4);
    uint64_t o1 = write_st(p1, HDR3, d1, sizeof d1);
    /* z F64 [2] at [0, 16); y I32 [2] at [16, 24) */
    uint64_t o2 = write_st(p2,
        "{\"z\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
        "\"y\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[16,24]}}", d2, sizeof d2);
    /* shard 2 is named first: shard ids follow file names, not index order */
    write_text(idx, "{\"metadata\":{\"total_size\":57},\"weight_map\":{"
                    "\"z\":\"s-2.safetensors\",\"y\":\"s-2.safetensors\",\"a\":\"s-1.safetensors\","
                    "\"b\":\"s-1.safetensors\",\"c\":\"s-1.safetensors\",\"e\":\"s-1.safetensors\"}}");
    ds41_err err = {{0}};
    ds41_st *st = NULL;
    int rc = ds41_st_open(dir, &st, &err);
    CHECK(rc == 0 && st, "open sharded: %s", err.msg);
    if (!st) return;
    CHECK(ds41_st_count(st) == 6, "count %zu", ds41_st_count(st));
    CHECK(ds41_st_shard_count(st) == 2, "shards %d", ds41_st_shard_count(st));
    CHECK(!strcmp(ds41_st_shard_path(st, 0), p1) && !strcmp(ds41_st_shard_path(st, 1), p2),
          "shard paths %s %s", ds41_st_shard_path(st, 0), ds41_st_shard_path(st, 1));
    CHECK(ds41_st_shard_bytes(st, 0) == o1 + 33 && ds41_st_shard_bytes(st, 1) == o2 + 24, "shard bytes");
    const char *order[6] = {"a", "b", "c", "e", "y", "z"};
    for (int i = 0; i < 6 && i < (int)ds41_st_count(st); i++)
        CHECK(!strcmp(ds41_st_at(st, (size_t)i)->name, order[i]), "order[%d] = %s", i,
              ds41_st_at(st, (size_t)i)->name);
    const ds41_tensor *a = ds41_st_find(st, "a"), *b = ds41_st_find(st, "b"),
                      *y = ds41_st_find(st, "y"), *z = ds41_st_find(st, "z");
    CHECK(a && b && y && z, "find");
    if (a && b && y && z) {
        CHECK(a->shard == 0 && b->shard == 0 && y->shard == 1 && z->shard == 1, "shard ids");
        CHECK(z->dtype == DS41_DT_F64 && z->ndim == 1 && z->shape[0] == 2 && z->nbytes == 16, "z");
        CHECK(y->dtype == DS41_DT_I32 && y->ndim == 1 && y->shape[0] == 2 && y->nbytes == 8, "y");
        CHECK(at_file_offset(z, o2) && at_file_offset(y, o2 + 16), "y/z file offsets");
        CHECK((const uint8_t *)y->data == (const uint8_t *)z->data + 16, "y after z");
        CHECK(memcmp(z->data, d2, 24) == 0, "shard 2 bytes");
        CHECK((const uint8_t *)a->data == (const uint8_t *)b->data + 24 && at_file_offset(b, o1),
              "shard 1 offsets");
        CHECK(memcmp(b->data, d1, 33) == 0, "shard 1 bytes");
        CHECK(((uintptr_t)z->data & 7) == 0 && ((uintptr_t)b->data & 3) == 0, "aligned views");
    }
    ds41_st_close(st);
}

static void test_buffer(void) {
    /* image = length + padded header + 33 data bytes, in 8-byte aligned storage */
    static uint64_t store[256];
    uint8_t *img = (uint8_t *)store;
    size_t h = strlen(HDR3), padded = h + (8 - (8 + h) % 8) % 8;
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(img + 8, HDR3, h);
    memset(img + 8 + h, ' ', padded - h);
    uint8_t *data = img + 8 + padded;
    fill_pattern(data, 33, 5);
    size_t len = 8 + padded + 33;
    CHECK(len + 1 <= sizeof store, "image fits");

    ds41_err err = {{0}};
    ds41_st *st = NULL;
    int rc = ds41_st_open_buffer(img, len, "mem", &st, &err);
    CHECK(rc == 0 && st, "open_buffer: %s", err.msg);
    if (st) {
        check_hdr3(st, data, 8 + padded, data, "buffer");
        CHECK(!strcmp(ds41_st_shard_path(st, 0), "mem") && ds41_st_shard_bytes(st, 0) == len, "label");
        ds41_st_close(st);
    }
    /* one byte short: the last tensor ends past the data section */
    rc = ds41_st_open_buffer(img, len - 1, "short", &st, &err);
    CHECK(rc == -1 && strstr(err.msg, "short: tensor 'e': data_offsets [33, 33] end past"),
          "message: %s", err.msg);
    /* the same image one byte off: the F32 tensor "b" is no longer 4-byte aligned */
    memmove(img + 1, img, len);
    st = NULL;
    rc = ds41_st_open_buffer(img + 1, len, "mem1", &st, &err);
    CHECK(rc == -1 && !st, "misaligned buffer accepted");
    CHECK(strstr(err.msg, "mem1: tensor 'b': data at file offset") && strstr(err.msg, "not aligned"),
          "message: %s", err.msg);
    /* headers without tensors are valid files with nothing in them */
    static const char *empty[] = {"{}      ", "{\"__metadata__\":{\"k\":\"v\"}}   "};
    for (int i = 0; i < 2; i++) {
        size_t el = strlen(empty[i]);
        uint8_t *e = (uint8_t *)store;
        memset(e, 0, 8);
        e[0] = (uint8_t)el;
        memcpy(e + 8, empty[i], el);
        st = NULL;
        rc = ds41_st_open_buffer(e, 8 + el, "empty", &st, &err);
        CHECK(rc == 0 && st && ds41_st_count(st) == 0 && ds41_st_at(st, 0) == NULL &&
              ds41_st_find(st, "k") == NULL, "empty header %d: %s", i, err.msg);
        if (st) ds41_st_close(st);
    }
    rc = ds41_st_open_buffer(NULL, 0, NULL, &st, &err);
    CHECK(rc == -1 && strstr(err.msg, "<buffer>: truncated"), "message: %s", err.msg);
}

/* 50,000 tensors over 5 shards, listed in scrambled order: exercises sort, find,
 * index cross-checking at scale. */
static void test_many_tensors(void) {
    enum { N = 50000, S = 5 };
    char dir[4200];
    mkdir(tmp_path(dir, sizeof dir, "many"), 0700);
    size_t cap = (size_t)N * 96 + 64;
    char *hdr[S], *idx = malloc(cap);
    size_t hl[S], il = 0;
    uint64_t off[S];
    int32_t *vals[S];   /* tensor i holds {i, -i}: checks every offset end to end */
    for (int s = 0; s < S; s++) {
        vals[s] = malloc((size_t)N / S * 8 + 8);
        hdr[s] = malloc(cap);
        hl[s] = (size_t)sprintf(hdr[s], "{");
        off[s] = 0;
    }
    il = (size_t)sprintf(idx, "{\"weight_map\":{");
    for (int k = 0; k < N; k++) {
        int i = (int)((long)k * 7919 % N);   /* 7919 is prime and coprime with N */
        int s = i % S;
        hl[s] += (size_t)sprintf(hdr[s] + hl[s], "%s\"blk.%05d.w\":{\"dtype\":\"I32\",\"shape\":[2],"
                                 "\"data_offsets\":[%llu,%llu]}", off[s] ? "," : "", i,
                                 (unsigned long long)off[s], (unsigned long long)off[s] + 8);
        vals[s][off[s] / 4] = i;
        vals[s][off[s] / 4 + 1] = -i;
        off[s] += 8;
        il += (size_t)sprintf(idx + il, "%s\"blk.%05d.w\":\"m%d.safetensors\"", k ? "," : "", i, s);
    }
    strcpy(idx + il, "}}");
    uint64_t doff[S];
    for (int s = 0; s < S; s++) {
        strcpy(hdr[s] + hl[s], "}");
        char p[4300];
        snprintf(p, sizeof p, "%s/m%d.safetensors", dir, s);
        doff[s] = write_st(p, hdr[s], vals[s], off[s]);
        free(vals[s]);
        free(hdr[s]);
    }
    char ip[4300];
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    write_text(ip, idx);
    free(idx);

    ds41_err err = {{0}};
    ds41_st *st = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ds41_st_open(dir, &st, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(rc == 0 && st, "open: %s", err.msg);
    if (!st) return;
    printf("  info: opened %d tensors in %d shards in %.1f ms (not asserted)\n", N, S,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    CHECK(ds41_st_count(st) == N, "count %zu", ds41_st_count(st));
    int bad = 0;
    for (int i = 0; i < N && i < (int)ds41_st_count(st); i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%05d.w", i);
        const ds41_tensor *t = ds41_st_at(st, (size_t)i);
        if (strcmp(t->name, name) || ds41_st_find(st, name) != t || t->shard != i % S ||
            t->dtype != DS41_DT_I32 || t->nbytes != 8 || ((const int32_t *)t->data)[0] != i ||
            ((const int32_t *)t->data)[1] != -i)
            bad++;
    }
    CHECK(bad == 0, "%d tensors wrong", bad);
    /* blk.00000.w is the first tensor written to shard 0 */
    const ds41_tensor *first = ds41_st_find(st, "blk.00000.w");
    CHECK(first && at_file_offset(first, doff[0]), "first tensor offset");
    ds41_st_close(st);
}

/* 1 when the VMA holding address a lists flag f in /proc/self/smaps' VmFlags, 0 when not,
 * -1 when no VMA or no smaps */
static int vma_has_flag(uintptr_t a, const char *f) {
    FILE *m = fopen("/proc/self/smaps", "r");
    if (!m) return -1;
    char line[512];
    int in = 0, r = -1;
    while (fgets(line, sizeof line, m)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') && strchr(line, ' ') > strchr(line, '-')) {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) {
            r = 0;
            for (char *t = strtok(line + 8, " \n"); t; t = strtok(NULL, " \n"))
                if (!strcmp(t, f)) r = 1;
            break;
        }
    }
    fclose(m);
    return r;
}

/* Opens a 64 MiB file whose data section is a hole and checks with mincore() that
 * no page past the header is in the page cache afterwards; then touches one tensor
 * byte to show the check sees resident pages. */
static void test_no_data_touched(void) {
    enum { NT = 64, ROWS = 512, COLS = 1024 };   /* BF16 [512, 1024] = 1 MiB each */
    char path[4200];
    tmp_path(path, sizeof path, "sparse.safetensors");
    char *hdr = malloc(16384);
    size_t hl = (size_t)sprintf(hdr, "{");
    uint64_t tb = (uint64_t)ROWS * COLS * 2;
    for (int i = 0; i < NT; i++)
        hl += (size_t)sprintf(hdr + hl, "%s\"t%02d\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],"
                              "\"data_offsets\":[%llu,%llu]}", i ? "," : "", i, ROWS, COLS,
                              (unsigned long long)(tb * (uint64_t)i),
                              (unsigned long long)(tb * (uint64_t)(i + 1)));
    strcpy(hdr + hl, "}");
    uint64_t doff = write_st(path, hdr, NULL, 0);
    free(hdr);
    uint64_t fsize = doff + tb * NT;
    CHECK(truncate(path, (off_t)fsize) == 0, "truncate");
    /* Cold cache, as for a checkpoint on disk: written back and dropped, the header's
     * pages must be read by the open itself, which is when fault readahead would pull
     * tensor pages in behind them. */
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0,
          "drop page cache");
    if (fd >= 0) close(fd);

    ds41_err err = {{0}};
    ds41_st *st = NULL;
    int rc = ds41_st_open(path, &st, &err);
    CHECK(rc == 0 && st, "open: %s", err.msg);
    if (!st) return;
    const ds41_tensor *t0 = ds41_st_find(st, "t00"), *t40 = ds41_st_find(st, "t40");
    CHECK(t0 && t40 && ds41_st_count(st) == NT, "tensors");
    if (t0 && t40) {
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        const uint8_t *base = (const uint8_t *)t0->data - doff;   /* the mapping */
        size_t first = (size_t)((doff + pg - 1) / pg);               /* first page after the header's */
        size_t npages = (size_t)((fsize + pg - 1) / pg) - first;
        unsigned char *vec = malloc(npages);
        rc = mincore((void *)(base + first * pg), npages * pg, vec);
        CHECK(rc == 0, "mincore");
        size_t resident = 0;
        for (size_t i = 0; i < npages; i++) resident += vec[i] & 1;
        CHECK(resident == 0, "%zu of %zu data pages resident after open", resident, npages);
        printf("  info: %zu data pages, %zu resident after open\n", npages, resident);
        /* sanity: a read of one tensor byte must show up */
        volatile uint8_t x = ((const volatile uint8_t *)t40->data)[12345];
        (void)x;
        size_t p40 = (size_t)(((const uint8_t *)t40->data + 12345 - base) / pg);
        rc = mincore((void *)(base + p40 * pg), pg, vec);
        CHECK(rc == 0 && (vec[0] & 1), "touched page not seen as resident");
        free(vec);
        /* the mapping (map_file_aligned): at a 2 MiB-aligned address, exactly the file long
         * (the reserved span past it unmapped again), and the huge-page advice ("hg" in the
         * VMA's flags) on the tensor bytes from the first 2 MiB boundary past the header,
         * not on the header's own span, where kernels with transparent huge pages have it */
        const uint64_t huge = (uint64_t)2 << 20;
        CHECK(((uintptr_t)base & (huge - 1)) == 0, "mapping at %p, not 2 MiB-aligned", (const void *)base);
        size_t end = (size_t)((fsize + pg - 1) / pg) * pg;
        unsigned char v1;
        errno = 0;
        CHECK(mincore((void *)(base + end), pg, &v1) == -1 && errno == ENOMEM, "the page after the file is mapped");
        int thp = 0;
        FILE *tf = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
        if (tf) {
            char mode[128] = "";
            thp = fgets(mode, sizeof mode, tf) && !strstr(mode, "[never]");
            fclose(tf);
        }
        uintptr_t data_at = (uintptr_t)base + (uintptr_t)((doff + huge - 1) / huge * huge);
        int hg_data = vma_has_flag(data_at, "hg"), hg_head = vma_has_flag((uintptr_t)base, "hg");
        if (thp) CHECK(hg_data == 1 && hg_head == 0, "huge-page advice: tensor bytes %d, header %d", hg_data, hg_head);
        printf("  info: mapping 2 MiB-aligned; huge-page advice on the tensor bytes %d, on the header %d (THP %s)\n",
               hg_data, hg_head, thp ? "on" : "off");
    }
    ds41_st_close(st);
}

static void test_bad_paths(void) {
    ds41_err err = {{0}};
    ds41_st *st = (ds41_st *)&err;   /* must be reset to NULL on failure */
    char dir[4200];
    mkdir(tmp_path(dir, sizeof dir, "empty"), 0700);
    CHECK(ds41_st_open(dir, &st, &err) == -1 && st == NULL, "empty dir accepted");
    CHECK(strstr(err.msg, "empty: directory has no model.safetensors.index.json and no "
                          "*.safetensors file") != NULL, "message: %s", err.msg);
    char p[4300];
    snprintf(p, sizeof p, "%s/does-not-exist.safetensors", dir);
    CHECK(ds41_st_open(p, &st, &err) == -1 && strstr(err.msg, "does-not-exist.safetensors: cannot open"),
          "message: %s", err.msg);
}

/* ------------------------------------------------------------------ malformed corpus */

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int corpus_case(const char *cdir) {
    char ep[4500], in[4500];
    snprintf(ep, sizeof ep, "%s/expected", cdir);
    char *expected = NULL;
    size_t elen = 0;
    ds41_err err = {{0}};
    if (ds41_read_file(ep, 4096, &expected, &elen, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return 0;
    }
    while (elen && (expected[elen - 1] == '\n' || expected[elen - 1] == '\r')) expected[--elen] = 0;
    CHECK(elen > 0, "empty expected file");
    snprintf(in, sizeof in, "%s/ckpt", cdir);
    int dir_case = is_dir(in);
    if (!dir_case) snprintf(in, sizeof in, "%s/model.safetensors", cdir);

    ds41_st *st = NULL;
    int rc = ds41_st_open(in, &st, &err);
    CHECK(rc == -1 && st == NULL, "%s opened", in);
    if (st) ds41_st_close(st);
    CHECK(strstr(err.msg, expected) != NULL, "message \"%s\" lacks \"%s\"", err.msg, expected);
    CHECK(strchr(err.msg, '\n') == NULL, "multi-line message");
    CHECK(strstr(err.msg, cdir) != NULL, "message does not name a file under %s: %s", cdir, err.msg);

    if (!dir_case) {
        /* the in-memory parser must agree with the file parser, word for word */
        char *img = NULL;
        size_t len = 0;
        ds41_err e2 = {{0}};
        if (ds41_read_file(in, 1 << 20, &img, &len, &e2) == 0) {
            ds41_st *s2 = NULL;
            rc = ds41_st_open_buffer(img, len, in, &s2, &e2);
            CHECK(rc == -1 && !s2, "buffer parse accepted %s", in);
            if (s2) ds41_st_close(s2);
            CHECK(strcmp(err.msg, e2.msg) == 0, "buffer message differs: %s", e2.msg);
            free(img);
        } else {
            CHECK(0, "%s", e2.msg);
        }
    }
    free(expected);
    return 1;
}

static void test_malformed_corpus(void) {
    char base[4000];
    snprintf(base, sizeof base, "%.3900s/tests/malformed/st", root_dir());
    struct dirent **ents = NULL;
    int n = scandir(base, &ents, NULL, alphasort);
    int cases = 0;
    for (int i = 0; i < n; i++) {
        char cdir[4400];
        snprintf(cdir, sizeof cdir, "%s/%s", base, ents[i]->d_name);
        if (ents[i]->d_name[0] != '.' && is_dir(cdir)) {
            char name[400];
            snprintf(name, sizeof name, "malformed_st/%s", ents[i]->d_name);
            CASE_BEGIN();
            cases += corpus_case(cdir);
            case_end(name);
        }
        free(ents[i]);
    }
    free(ents);
    CASE_BEGIN();
    CHECK(n > 0, "cannot list %s", base);
    CHECK(cases >= 20, "only %d malformed cases", cases);
    case_end("malformed_corpus_size");
}

int main(void) {
    make_tmp_root();
    RUN_CASE(test_dtypes);
    RUN_CASE(test_valid_single);
    RUN_CASE(test_valid_sharded);
    RUN_CASE(test_buffer);
    RUN_CASE(test_many_tensors);
    RUN_CASE(test_no_data_touched);
    RUN_CASE(test_bad_paths);
    test_malformed_corpus();
    nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return check_exit();
}
