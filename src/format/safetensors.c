/* ds41 safetensors: strict reader for one file or a sharded checkpoint directory.
 *
 * A safetensors file is: 8-byte little-endian header length N, N bytes of JSON
 * (an object: tensor name -> {dtype, shape, data_offsets}, plus an optional
 * "__metadata__" object of strings), then the data section. data_offsets are
 * relative to the start of the data section.
 *
 * Every file is mapped read-only (MAP_PRIVATE, PROT_READ); tensors are views into
 * the mapping. Only header bytes are read while opening: the production checkpoint
 * is ~510 GB in 48 shards and opening it must cost milliseconds and no I/O beyond
 * the headers. Everything in a header is validated before any of it is used. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_INDEX_NAME "model.safetensors.index.json"

/* ------------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    int size;
} dtype_info[DS41_DT_COUNT] = {
    [DS41_DT_BF16] = {"BF16", 2},       [DS41_DT_F16] = {"F16", 2},
    [DS41_DT_F32] = {"F32", 4},         [DS41_DT_F64] = {"F64", 8},
    [DS41_DT_F8_E4M3] = {"F8_E4M3", 1}, [DS41_DT_F8_E5M2] = {"F8_E5M2", 1},
    [DS41_DT_F8_E8M0] = {"F8_E8M0", 1}, [DS41_DT_I8] = {"I8", 1},
    [DS41_DT_U8] = {"U8", 1},           [DS41_DT_I16] = {"I16", 2},
    [DS41_DT_U16] = {"U16", 2},         [DS41_DT_I32] = {"I32", 4},
    [DS41_DT_U32] = {"U32", 4},         [DS41_DT_I64] = {"I64", 8},
    [DS41_DT_U64] = {"U64", 8},         [DS41_DT_BOOL] = {"BOOL", 1},
};

const char *ds41_dtype_name(ds41_dtype dt) {
    return (unsigned)dt < DS41_DT_COUNT ? dtype_info[dt].name : "?";
}

int ds41_dtype_size(ds41_dtype dt) {
    return (unsigned)dt < DS41_DT_COUNT ? dtype_info[dt].size : 0;
}

int ds41_dtype_parse(const char *s, ds41_dtype *out) {
    for (int i = 0; i < DS41_DT_COUNT; i++) {
        if (strcmp(s, dtype_info[i].name) == 0) {
            *out = (ds41_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ state */

typedef struct st_shard {
    char *path;            /* file path (or the buffer's label): named in every error */
    const uint8_t *base;   /* whole file image */
    uint64_t size;
    void *map;             /* our mmap, NULL for a caller's buffer */
    size_t map_len;        /* its length when not the file size (an anonymous copy) */
    char *names;           /* arena holding this shard's tensor names */
} st_shard;

struct ds41_st {
    st_shard *shards;
    int nshards;
    ds41_tensor *tensors;  /* sorted by name once open succeeds */
    size_t ntensors, cap;
};

/* ------------------------------------------------------------------ message helpers */

/* Names come from untrusted JSON: print them bounded and without control bytes,
 * so that every error stays one line. */
static const char *show(const char *s, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 8 >= cap) {
            memcpy(buf + o, "...", 4);
            return buf;
        }
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}
#define SHOW(s) show((s), (char[160]){0}, 160)

static void one_line(ds41_err *err) {
    if (!err) return;
    for (char *p = err->msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real number";
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

static void format_shape(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------ header parsing */

typedef struct st_range {
    uint64_t begin, end;
    size_t tensor;         /* index into st->tensors */
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int check_metadata(const char *file, json_t *meta, ds41_err *err) {
    if (!json_is_object(meta))
        return ds41_errf(err, "%s: __metadata__ is a JSON %s, expected an object of strings", file,
                         json_kind(meta));
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return ds41_errf(err, "%s: __metadata__ entry '%s' is a JSON %s, expected a string", file,
                             SHOW(k), json_kind(v));
    }
    return 0;
}

/* Reads a JSON integer that must be >= 0. */
static int get_nonneg(json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -2;
    *out = (uint64_t)x;
    return 0;
}

/* Validates one tensor entry and fills t (except name and shard). data_size is the
 * size of the data section, data the address of its first byte. */
static int parse_tensor(const char *file, const char *name, json_t *val, const uint8_t *data,
                        uint64_t data_off, uint64_t data_size, ds41_tensor *t, st_range *r,
                        ds41_err *err) {
    const char *nm = SHOW(name);
    if (!json_is_object(val))
        return ds41_errf(err, "%s: tensor '%s': entry is a JSON %s, expected an object with dtype, "
                         "shape and data_offsets", file, nm, json_kind(val));
    json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
           *jo = json_object_get(val, "data_offsets");
    const char *missing = !jd ? "dtype" : !js ? "shape" : !jo ? "data_offsets" : NULL;
    if (missing) return ds41_errf(err, "%s: tensor '%s': missing field '%s'", file, nm, missing);
    if (json_object_size(val) != 3) {
        const char *k;
        json_t *v;
        json_object_foreach(val, k, v) {
            if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
                return ds41_errf(err, "%s: tensor '%s': unexpected field '%s' (expected only dtype, "
                                 "shape, data_offsets)", file, nm, SHOW(k));
        }
    }

    if (!json_is_string(jd))
        return ds41_errf(err, "%s: tensor '%s': dtype is a JSON %s, expected a string", file, nm,
                         json_kind(jd));
    if (ds41_dtype_parse(json_string_value(jd), &t->dtype) != 0)
        return ds41_errf(err, "%s: tensor '%s': unknown dtype '%s' (expected BF16, F16, F32, F64, "
                         "F8_E4M3, F8_E5M2, F8_E8M0, I8, U8, I16, U16, I32, U32, I64, U64 or BOOL)",
                         file, nm, SHOW(json_string_value(jd)));
    uint64_t esize = (uint64_t)ds41_dtype_size(t->dtype);

    if (!json_is_array(js))
        return ds41_errf(err, "%s: tensor '%s': shape is a JSON %s, expected an array of integers",
                         file, nm, json_kind(js));
    size_t ndim = json_array_size(js);
    if (ndim > DS41_MAX_DIMS)
        return ds41_errf(err, "%s: tensor '%s': shape has %zu dimensions, at most %d supported",
                         file, nm, ndim, DS41_MAX_DIMS);
    t->ndim = (int)ndim;
    memset(t->shape, 0, sizeof t->shape);
    uint64_t nelem = 1;
    int overflow = 0;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(js, i);
        uint64_t dim;
        int rc = get_nonneg(d, &dim);
        if (rc == -1)
            return ds41_errf(err, "%s: tensor '%s': shape[%zu] is a JSON %s, expected a non-negative "
                             "integer", file, nm, i, json_kind(d));
        if (rc == -2)
            return ds41_errf(err, "%s: tensor '%s': shape[%zu] is %lld, expected a non-negative "
                             "integer", file, nm, i, (long long)json_integer_value(d));
        t->shape[i] = (int64_t)dim;
        /* keep multiplying after an overflow only to report the whole shape */
        if (ds41_mul_u64(nelem, dim, &nelem) != 0) overflow = 1;
    }
    char shp[256];
    format_shape(t->shape, t->ndim, shp, sizeof shp);
    uint64_t nbytes;
    /* a zero dimension makes the tensor empty whatever the others say */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) overflow = 0, nelem = 0;
    if (overflow || ds41_mul_u64(nelem, esize, &nbytes) != 0)
        return ds41_errf(err, "%s: tensor '%s': shape %s x %llu-byte %s overflows 64-bit size",
                         file, nm, shp, (unsigned long long)esize, ds41_dtype_name(t->dtype));

    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return ds41_errf(err, "%s: tensor '%s': data_offsets is a JSON %s%s, expected [begin, end]",
                         file, nm, json_kind(jo),
                         json_is_array(jo) ? " of the wrong length" : "");
    uint64_t off[2];
    for (int i = 0; i < 2; i++) {
        json_t *d = json_array_get(jo, (size_t)i);
        int rc = get_nonneg(d, &off[i]);
        if (rc == -1)
            return ds41_errf(err, "%s: tensor '%s': data_offsets[%d] is a JSON %s, expected a "
                             "non-negative integer", file, nm, i, json_kind(d));
        if (rc == -2)
            return ds41_errf(err, "%s: tensor '%s': data_offsets[%d] is %lld, expected a "
                             "non-negative integer", file, nm, i, (long long)json_integer_value(d));
    }
    unsigned long long b = off[0], e = off[1];
    if (b > e)
        return ds41_errf(err, "%s: tensor '%s': data_offsets [%llu, %llu] has begin > end", file, nm,
                         b, e);
    if (e - b != nbytes)
        return ds41_errf(err, "%s: tensor '%s': shape %s x %llu-byte %s is %llu bytes but "
                         "data_offsets [%llu, %llu] span %llu", file, nm, shp,
                         (unsigned long long)esize, ds41_dtype_name(t->dtype),
                         (unsigned long long)nbytes, b, e, e - b);
    if (e > data_size)
        return ds41_errf(err, "%s: tensor '%s': data_offsets [%llu, %llu] end past the data section "
                         "(%llu bytes from file offset %llu)", file, nm, b, e,
                         (unsigned long long)data_size, (unsigned long long)data_off);
    const uint8_t *p = data + b;
    /* ds41 reads weights through typed pointers; an empty tensor has nothing to read */
    if (nbytes && (uintptr_t)p % esize != 0)
        return ds41_errf(err, "%s: tensor '%s': data at file offset %llu is not aligned to its "
                         "%llu-byte %s elements (ds41 needs aligned views)", file, nm,
                         (unsigned long long)(data_off + b), (unsigned long long)esize,
                         ds41_dtype_name(t->dtype));
    t->data = p;
    t->nbytes = nbytes;
    r->begin = b;
    r->end = e;
    return 0;
}

static int grow_tensors(ds41_st *st, size_t extra, ds41_err *err, const char *file) {
    size_t need;
    if (__builtin_add_overflow(st->ntensors, extra, &need)) goto oom;
    if (need <= st->cap) return 0;
    size_t cap = st->cap ? st->cap : 64;
    while (cap < need)
        if (__builtin_mul_overflow(cap, 2, &cap)) goto oom;
    size_t bytes;
    if (__builtin_mul_overflow(cap, sizeof(ds41_tensor), &bytes)) goto oom;
    ds41_tensor *t = realloc(st->tensors, bytes);
    if (!t) goto oom;
    st->tensors = t;
    st->cap = cap;
    return 0;
oom:
    return ds41_errf(err, "%s: out of memory for %zu more tensors", file, extra);
}

/* Parses and validates the header of shard si and appends its tensors to st. */
static int parse_shard(ds41_st *st, int si, ds41_err *err) {
    st_shard *sh = &st->shards[si];
    const char *file = sh->path;
    if (sh->size < 8)
        return ds41_errf(err, "%s: truncated: file is %llu bytes, less than the 8-byte header length",
                         file, (unsigned long long)sh->size);
    uint64_t hlen = read_le64(sh->base);
    if (hlen > DS41_ST_MAX_HEADER)
        return ds41_errf(err, "%s: header length %llu (byte 0) exceeds the cap of %u bytes", file,
                         (unsigned long long)hlen, DS41_ST_MAX_HEADER);
    if (hlen > sh->size - 8)
        return ds41_errf(err, "%s: header length %llu (byte 0) is larger than the file: only %llu "
                         "bytes follow", file, (unsigned long long)hlen,
                         (unsigned long long)(sh->size - 8));
    uint64_t data_off = 8 + hlen, data_size = sh->size - data_off;
    const uint8_t *data = sh->base + data_off;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)sh->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ds41_errf(err, "%s: header JSON invalid at file offset %llu (line %d, column %d): %s",
                         file, (unsigned long long)(8 + (jerr.position > 0 ? jerr.position : 0)),
                         jerr.line, jerr.column, jerr.text);
    int rc = -1;
    st_range *ranges = NULL;
    if (!json_is_object(root)) {
        ds41_errf(err, "%s: header is a JSON %s, expected an object", file, json_kind(root));
        goto out;
    }

    /* pass 1: sizes, so that names go into one arena and the array grows once */
    size_t n = 0, name_bytes = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (check_metadata(file, val, err) != 0) goto out;
            continue;
        }
        if (!key[0]) {
            ds41_errf(err, "%s: header has a tensor with an empty name", file);
            goto out;
        }
        n++;
        name_bytes += strlen(key) + 1;   /* bounded by hlen: cannot overflow */
    }
    if (grow_tensors(st, n, err, file) != 0) goto out;
    sh->names = malloc(name_bytes ? name_bytes : 1);
    ranges = malloc((n ? n : 1) * sizeof *ranges);
    if (!sh->names || !ranges) {
        ds41_errf(err, "%s: out of memory for %zu tensors", file, n);
        goto out;
    }

    /* pass 2: validate every tensor */
    size_t first = st->ntensors, k = 0, no = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        ds41_tensor *t = &st->tensors[first + k];
        if (parse_tensor(file, key, val, data, data_off, data_size, t, &ranges[k], err) != 0)
            goto out;
        size_t len = strlen(key) + 1;
        memcpy(sh->names + no, key, len);
        t->name = sh->names + no;
        t->shard = si;
        ranges[k].tensor = first + k;
        no += len;
        k++;
    }

    /* no two tensors may share bytes: sort by begin and compare with the furthest end
     * seen so far. Empty ranges hold no bytes and cannot overlap anything. */
    qsort(ranges, n, sizeof *ranges, cmp_range);
    const st_range *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        const st_range *r = &ranges[i];
        if (r->begin == r->end) continue;
        if (prev && r->begin < prev->end) {
            char a[160];
            ds41_errf(err, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap at data "
                      "offset %llu", file, show(st->tensors[prev->tensor].name, a, sizeof a),
                      (unsigned long long)prev->begin, (unsigned long long)prev->end,
                      SHOW(st->tensors[r->tensor].name), (unsigned long long)r->begin,
                      (unsigned long long)r->end, (unsigned long long)r->begin);
            goto out;
        }
        if (!prev || r->end > prev->end) prev = r;
    }
    st->ntensors += n;
    rc = 0;
out:
    free(ranges);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------ opening files */

static void st_free(ds41_st *st) {
    if (!st) return;
    for (int i = 0; i < st->nshards; i++) {
        st_shard *sh = &st->shards[i];
        if (sh->map) munmap(sh->map, sh->map_len ? sh->map_len : (size_t)sh->size);
        free(sh->names);
        free(sh->path);
    }
    free(st->shards);
    free(st->tensors);
    free(st);
}

void ds41_st_close(ds41_st *st) { st_free(st); }

static ds41_st *st_new(int nshards, ds41_err *err) {
    ds41_st *st = calloc(1, sizeof *st);
    if (st) st->shards = calloc((size_t)(nshards > 0 ? nshards : 1), sizeof *st->shards);
    if (!st || !st->shards) {
        free(st);
        ds41_errf(err, "out of memory");
        return NULL;
    }
    return st;
}

#define HUGE_PAGE ((size_t)2 << 20)   /* a PMD-mapped transparent huge page */

/* A read-only private mapping of the whole file at a 2 MiB-aligned address (files of 2 MiB
 * and more; open_shard_file then advises huge pages past the header). Why: the weights are streamed on
 * every decode step, and with 4 KiB pages the TLB misses (a two-level walk in a VM) cost more
 * than the reads (measured: a production-width decode step 2.2x slower than the same weights
 * in huge pages). The page cache fills the advised range with huge folios where the kernel
 * can (its read-ahead uses PMD-sized folios on VM_HUGEPAGE mappings), and an aligned address
 * lets those be mapped by one PMD entry each. Without huge-page support the advice is ignored
 * and the mapping works as a plain mmap. The extra reserved span is unmapped again, so the
 * mapping is exactly [m, m + size) and munmap(m, size) releases it. */
static void *map_file_aligned(int fd, size_t size) {
    const size_t huge = HUGE_PAGE;
    if (size < huge) return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    size_t span = size + huge;
    uint8_t *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    uint8_t *a = (uint8_t *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
    void *m = mmap(a, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        munmap(r, span);
        errno = e;
        return MAP_FAILED;
    }
    if (a > r) munmap(r, (size_t)(a - r));
    /* the file mapping covers whole pages: the reserve is released from the page after it */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *end = a + (size + pg - 1) / pg * pg;
    if (end < r + span) munmap(end, (size_t)(r + span - end));
    return m;
}

/* Maps the file at sh->path and parses its header. */
static int open_shard_file(ds41_st *st, int si, ds41_err *err) {
    st_shard *sh = &st->shards[si];
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ds41_errf(err, "%s: cannot open: %s", sh->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ds41_errf(err, "%s: not a regular file", sh->path);
    }
    sh->size = (uint64_t)sb.st_size;
    if (sh->size < 8) {
        close(fd);
        return ds41_errf(err, "%s: truncated: file is %llu bytes, less than the 8-byte header length",
                         sh->path, (unsigned long long)sh->size);
    }
    void *m = map_file_aligned(fd, (size_t)sh->size);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return ds41_errf(err, "%s: mmap of %llu bytes failed: %s", sh->path,
                         (unsigned long long)sh->size, strerror(e));
    sh->map = m;
    sh->base = m;
    /* Why: touching the header page would otherwise start fault readahead into the
     * tensor bytes that follow it (hundreds of KB per shard, 48 shards). Random access
     * is advised on the header span only while parsing, then the default restored so
     * that weight reads get normal readahead. */
    size_t hspan = (size_t)(sh->size < 8 + (uint64_t)DS41_ST_MAX_HEADER ? sh->size
                                                                         : 8 + (uint64_t)DS41_ST_MAX_HEADER);
    madvise(m, hspan, MADV_RANDOM);
    int rc = parse_shard(st, si, err);
    madvise(m, hspan, MADV_NORMAL);
#ifdef MADV_HUGEPAGE
    /* huge pages for the tensor bytes, from the first 2 MiB boundary past the header (advised
     * after the parse: a huge-page fault on the header would read 2 MiB of tensors with it) */
    const uint64_t huge = HUGE_PAGE;
    uint64_t h0 = (8 + read_le64(m) + huge - 1) / huge * huge;   /* the header's length, parsed above */
    if (rc == 0 && ((uintptr_t)m & (huge - 1)) == 0 && h0 < sh->size)
        madvise((uint8_t *)m + h0, (size_t)(sh->size - h0), MADV_HUGEPAGE);
#endif
    return rc;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const ds41_tensor *)a)->name, ((const ds41_tensor *)b)->name);
}

/* Sorts all tensors by name and rejects a name that appears in two shards
 * (within one shard the JSON parser already rejects duplicate keys). */
static int finish(ds41_st *st, ds41_err *err) {
    if (st->ntensors > 1)   /* tensors is NULL for a header without tensors */
        qsort(st->tensors, st->ntensors, sizeof *st->tensors, cmp_tensor_name);
    for (size_t i = 1; i < st->ntensors; i++) {
        const ds41_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (strcmp(a->name, b->name) == 0) {
            int lo = a->shard < b->shard ? a->shard : b->shard;
            int hi = a->shard < b->shard ? b->shard : a->shard;
            return ds41_errf(err, "%s: tensor '%s' is also in %s (duplicate tensor name across shards)",
                             st->shards[hi].path, SHOW(a->name), st->shards[lo].path);
        }
    }
    return 0;
}

static int open_single(const char *path, ds41_st **out, ds41_err *err) {
    ds41_st *st = st_new(1, err);
    if (!st) return -1;
    st->nshards = 1;
    st->shards[0].path = strdup(path);
    if (!st->shards[0].path) {
        st_free(st);
        return ds41_errf(err, "out of memory");
    }
    if (open_shard_file(st, 0, err) != 0 || finish(st, err) != 0) {
        st_free(st);
        return -1;
    }
    *out = st;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard named by the index must be a plain file name in the checkpoint directory. */
static int bad_shard_name(const char *s) {
    return !s[0] || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0;
}

static int open_sharded(const char *dir, const char *index_path, ds41_st **out, ds41_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (ds41_read_file(index_path, DS41_ST_MAX_HEADER, &text, &len, err) != 0) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return ds41_errf(err, "%s: invalid JSON at byte %d (line %d, column %d): %s", index_path,
                         jerr.position, jerr.line, jerr.column, jerr.text);
    ds41_st *st = NULL;
    json_t *ids = NULL;
    const char **names = NULL;
    uint8_t *listed = NULL;
    int rc = -1;
    const char *key;
    json_t *val;

    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(root)) {
        ds41_errf(err, "%s: index is a JSON %s, expected an object with \"weight_map\"", index_path,
                  json_kind(root));
        goto out;
    }
    if (!wm) {
        ds41_errf(err, "%s: index has no \"weight_map\"", index_path);
        goto out;
    }
    if (!json_is_object(wm)) {
        ds41_errf(err, "%s: weight_map is a JSON %s, expected an object of tensor name -> shard file",
                  index_path, json_kind(wm));
        goto out;
    }
    if (json_object_size(wm) == 0) {
        ds41_errf(err, "%s: weight_map is empty", index_path);
        goto out;
    }

    /* distinct shard files, hashed, so that 96k entries over 48 shards stay linear */
    ids = json_object();
    if (!ids) goto oom;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) {
            ds41_errf(err, "%s: weight_map['%s'] is a JSON %s, expected a shard file name", index_path,
                      SHOW(key), json_kind(val));
            goto out;
        }
        const char *f = json_string_value(val);
        if (bad_shard_name(f)) {
            ds41_errf(err, "%s: weight_map['%s'] names shard '%s', expected a file name in the same "
                      "directory", index_path, SHOW(key), SHOW(f));
            goto out;
        }
        if (!json_object_get(ids, f) && json_object_set_new(ids, f, json_null()) != 0) goto oom;
    }
    size_t ns = json_object_size(ids);
    if (ns > 1u << 20) {
        ds41_errf(err, "%s: index names %zu shard files, more than supported", index_path, ns);
        goto out;
    }
    names = malloc(ns * sizeof *names);
    if (!names) goto oom;
    size_t i = 0;
    json_object_foreach(ids, key, val) names[i++] = key;
    qsort(names, ns, sizeof *names, cmp_str);   /* shard order, and ids: by file name */

    st = st_new((int)ns, err);
    if (!st) goto out;
    for (i = 0; i < ns; i++) {
        st_shard *sh = &st->shards[i];
        sh->path = ds41_path_join(dir, names[i]);
        if (!sh->path) goto oom;
        st->nshards = (int)i + 1;
        struct stat sb;
        if (stat(sh->path, &sb) != 0) {
            /* name one tensor that points at it, so the message is actionable */
            const char *who = "?";
            json_object_foreach(wm, key, val) {
                if (strcmp(json_string_value(val), names[i]) == 0) {
                    who = key;
                    break;
                }
            }
            ds41_errf(err, "%s: weight_map['%s'] names shard '%s', but %s is missing: %s", index_path,
                      SHOW(who), SHOW(names[i]), sh->path, strerror(errno));
            goto out;
        }
        if (open_shard_file(st, (int)i, err) != 0) goto out;
    }
    if (finish(st, err) != 0) goto out;

    /* index and shards must agree exactly, both ways */
    listed = calloc(st->ntensors ? st->ntensors : 1, 1);
    if (!listed) goto oom;
    json_object_foreach(wm, key, val) {
        const char *f = json_string_value(val);
        int sid = (int)((const char **)bsearch(&f, names, ns, sizeof *names, cmp_str) - names);
        const ds41_tensor *t = ds41_st_find(st, key);
        if (!t) {
            ds41_errf(err, "%s: weight_map['%s'] points at shard '%s', which has no tensor of that "
                      "name", index_path, SHOW(key), SHOW(json_string_value(val)));
            goto out;
        }
        if (t->shard != sid) {
            char a[160];
            ds41_errf(err, "%s: weight_map['%s'] points at shard '%s', which has no tensor of that "
                      "name (it is in %s)", index_path, SHOW(key),
                      show(json_string_value(val), a, sizeof a), st->shards[t->shard].path);
            goto out;
        }
        listed[t - st->tensors] = 1;
    }
    for (i = 0; i < st->ntensors; i++) {
        if (!listed[i]) {
            ds41_errf(err, "%s: tensor '%s' is in the shard but missing from %s weight_map",
                      st->shards[st->tensors[i].shard].path, SHOW(st->tensors[i].name), index_path);
            goto out;
        }
    }
    *out = st;
    st = NULL;
    rc = 0;
    goto out;
oom:
    ds41_errf(err, "%s: out of memory", index_path);
out:
    st_free(st);
    free(listed);
    free(names);
    json_decref(ids);
    json_decref(root);
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a > b && strcmp(s + a - b, suffix) == 0;
}

/* A directory without an index: model.safetensors, or else its only *.safetensors. */
static int open_dir(const char *dir, ds41_st **out, ds41_err *err) {
    char *index_path = ds41_path_join(dir, ST_INDEX_NAME);
    if (!index_path) return ds41_errf(err, "out of memory");
    struct stat sb;
    if (stat(index_path, &sb) == 0) {
        int rc = open_sharded(dir, index_path, out, err);
        free(index_path);
        return rc;
    }
    free(index_path);

    DIR *d = opendir(dir);
    if (!d) return ds41_errf(err, "%s: cannot open directory: %s", dir, strerror(errno));
    char first[256] = "", second[256] = "";
    int count = 0, has_model = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!ends_with(de->d_name, ".safetensors")) continue;
        if (strcmp(de->d_name, "model.safetensors") == 0) has_model = 1;
        if (count == 0) snprintf(first, sizeof first, "%s", de->d_name);
        else if (count == 1) snprintf(second, sizeof second, "%s", de->d_name);
        count++;
    }
    closedir(d);
    if (count == 0)
        return ds41_errf(err, "%s: directory has no %s and no *.safetensors file", dir, ST_INDEX_NAME);
    if (count > 1 && !has_model)
        return ds41_errf(err, "%s: directory has %d *.safetensors files ('%s', '%s', ...) but no %s "
                         "saying how they fit together", dir, count, SHOW(first), SHOW(second),
                         ST_INDEX_NAME);
    char *file = ds41_path_join(dir, has_model ? "model.safetensors" : first);
    if (!file) return ds41_errf(err, "out of memory");
    int rc = open_single(file, out, err);
    free(file);
    return rc;
}

/* ------------------------------------------------------------------ public API */

int ds41_st_open(const char *path, ds41_st **out, ds41_err *err) {
    *out = NULL;
    struct stat sb;
    int rc;
    if (stat(path, &sb) != 0) rc = ds41_errf(err, "%s: cannot open: %s", path, strerror(errno));
    else if (S_ISDIR(sb.st_mode)) rc = open_dir(path, out, err);
    else rc = open_single(path, out, err);
    if (rc) one_line(err);
    return rc;
}

int ds41_st_open_buffer(const void *buf, size_t len, const char *label, ds41_st **out, ds41_err *err) {
    *out = NULL;
    ds41_st *st = st_new(1, err);
    if (!st) return -1;
    st->nshards = 1;
    st_shard *sh = &st->shards[0];
    sh->path = strdup(label ? label : "<buffer>");
    sh->base = buf;
    sh->size = len;
    if (!sh->path) {
        st_free(st);
        return ds41_errf(err, "out of memory");
    }
    if (parse_shard(st, 0, err) != 0 || finish(st, err) != 0) {
        st_free(st);
        one_line(err);
        return -1;
    }
    *out = st;
    return 0;
}

size_t ds41_st_count(const ds41_st *st) { return st->ntensors; }

const ds41_tensor *ds41_st_at(const ds41_st *st, size_t i) {
    return i < st->ntensors ? &st->tensors[i] : NULL;
}

const ds41_tensor *ds41_st_find(const ds41_st *st, const char *name) {
    size_t lo = 0, hi = st->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int ds41_st_shard_count(const ds41_st *st) { return st->nshards; }

const char *ds41_st_shard_path(const ds41_st *st, int i) {
    return i >= 0 && i < st->nshards ? st->shards[i].path : NULL;
}

uint64_t ds41_st_shard_bytes(const ds41_st *st, int i) {
    return i >= 0 && i < st->nshards ? st->shards[i].size : 0;
}

int ds41_st_locate(const ds41_st *st, const void *p, uint64_t n, int *shard, uint64_t *offset) {
    const uint8_t *q = p;
    for (int i = 0; i < st->nshards; i++) {
        const st_shard *sh = &st->shards[i];
        /* only a file mapping has file offsets: not a caller's buffer, not an anonymous copy */
        if (!sh->map || sh->map_len || q < sh->base || q >= sh->base + sh->size) continue;
        if ((uint64_t)(q - sh->base) + n > sh->size) return -1;
        *shard = i;
        *offset = (uint64_t)(q - sh->base);
        return 0;
    }
    return -1;
}

int ds41_st_dir_has_tensors(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (!strcmp(e->d_name, "model.safetensors.index.json")) found = 1;
        else if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) found = 1;
    }
    closedir(d);
    return found;
}

/* ------------------------------------------------------------------ copy into anonymous memory */

typedef struct byte_range { uint64_t a, z; } byte_range;

static int range_cmp(const void *x, const void *y) {
    uint64_t a = ((const byte_range *)x)->a, b = ((const byte_range *)y)->a;
    return a < b ? -1 : a > b;
}

/* pread [off, end) of fd into m + off; 0, or -1 with errno set */
static int read_span(int fd, uint8_t *m, uint64_t off, uint64_t end) {
    while (off < end) {
        size_t want = end - off > ((uint64_t)64 << 20) ? ((size_t)64 << 20) : (size_t)(end - off);
        ssize_t got = pread(fd, m + off, want, (off_t)off);
        if (got <= 0) {
            if (got == 0) errno = EIO;
            return -1;
        }
        off += (uint64_t)got;
    }
    return 0;
}

int ds41_st_copy_anon(ds41_st *st, ds41_err *err) { return ds41_st_copy_anon_skip(st, NULL, NULL, err); }

int ds41_st_copy_anon_skip(ds41_st *st, int (*skip)(const ds41_tensor *t, void *arg), void *arg, ds41_err *err) {
    for (int i = 0; i < st->nshards; i++) {
        st_shard *sh = &st->shards[i];
        if (!sh->map || sh->map_len) continue;   /* a caller's buffer, or already copied */
        size_t huge = (size_t)2 << 20, len = ((size_t)sh->size + huge - 1) / huge * huge;
        uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return ds41_errf(err, "%s: cannot allocate %zu bytes for a copy of the weights: %s", sh->path, len,
                             strerror(errno));
#ifdef MADV_HUGEPAGE
        madvise(m, len, MADV_HUGEPAGE);   /* advice: without transparent huge pages it is ignored */
#endif
        int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) { munmap(m, len); return ds41_errf(err, "%s: cannot open: %s", sh->path, strerror(errno)); }
        /* the skipped tensors' bytes, in file order; everything between them is read */
        size_t ns = 0;
        byte_range *sk = NULL;
        if (skip) {
            sk = malloc((st->ntensors ? st->ntensors : 1) * sizeof *sk);
            if (!sk) { close(fd); munmap(m, len); return ds41_errf(err, "out of memory"); }
            for (size_t t = 0; t < st->ntensors; t++)
                if (st->tensors[t].shard == i && st->tensors[t].nbytes && skip(&st->tensors[t], arg)) {
                    sk[ns].a = (uint64_t)((const uint8_t *)st->tensors[t].data - sh->base);
                    sk[ns].z = sk[ns].a + st->tensors[t].nbytes;
                    ns++;
                }
            qsort(sk, ns, sizeof *sk, range_cmp);
#ifdef MADV_NOHUGEPAGE
            /* a huge page would fill the skipped bytes around a copied one: their whole pages
             * (runs of skipped tensors less than a page apart) are kept out of huge pages */
            for (size_t k = 0; k < ns;) {
                uint64_t a = sk[k].a, z = sk[k].z;
                for (k++; k < ns && sk[k].a < z + 4096; k++)
                    if (sk[k].z > z) z = sk[k].z;
                uint64_t pa = (a + 4095) & ~(uint64_t)4095, pz = z & ~(uint64_t)4095;
                if (pz > pa) madvise(m + pa, (size_t)(pz - pa), MADV_NOHUGEPAGE);
            }
#endif
        }
        uint64_t off = 0;
        int bad = 0;
        for (size_t k = 0; k <= ns; k++) {
            uint64_t end = k < ns ? sk[k].a : sh->size;
            if (end > off && read_span(fd, m, off, end)) {
                bad = 1;
                break;
            }
            if (k < ns && sk[k].z > off) off = sk[k].z;   /* overlapping ranges: the furthest end */
        }
        int e = errno;
        free(sk);
        close(fd);
        if (bad) {
            munmap(m, len);
            return ds41_errf(err, "%s: read failed: %s", sh->path, strerror(e));
        }
        mprotect(m, len, PROT_READ);
        /* the copy replaces the file mapping: every tensor of the shard moves with it */
        for (size_t t = 0; t < st->ntensors; t++)
            if (st->tensors[t].shard == i)
                st->tensors[t].data = m + ((const uint8_t *)st->tensors[t].data - sh->base);
        munmap(sh->map, (size_t)sh->size);
        sh->map = m;
        sh->base = m;
        sh->map_len = len;
    }
    return 0;
}

void ds41_st_willneed(const void *p, uint64_t n) {
    uintptr_t a = (uintptr_t)p, pg = 4096, lo = a & ~(pg - 1), hi = a + n;
    if (n) madvise((void *)lo, hi - lo, MADV_WILLNEED);
}
