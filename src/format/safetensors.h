/* ds41 safetensors: one file or a sharded directory (model.safetensors.index.json),
 * memory-mapped read-only, nothing copied, validated strictly before use. */
#ifndef DS41_SAFETENSORS_H
#define DS41_SAFETENSORS_H

#include "common.h"

typedef enum ds41_dtype {
    DS41_DT_BF16, DS41_DT_F16, DS41_DT_F32, DS41_DT_F64,
    DS41_DT_F8_E4M3, DS41_DT_F8_E5M2, DS41_DT_F8_E8M0,
    DS41_DT_I8, DS41_DT_U8, DS41_DT_I16, DS41_DT_U16, DS41_DT_I32, DS41_DT_U32,
    DS41_DT_I64, DS41_DT_U64, DS41_DT_BOOL,
    DS41_DT_COUNT
} ds41_dtype;

const char *ds41_dtype_name(ds41_dtype dt);          /* "BF16", ... */
int ds41_dtype_size(ds41_dtype dt);                  /* bytes per element */
int ds41_dtype_parse(const char *s, ds41_dtype *out); /* 0 ok, -1 unknown */

#define DS41_MAX_DIMS 8

typedef struct ds41_tensor {
    const char *name;
    ds41_dtype dtype;
    int ndim;
    int64_t shape[DS41_MAX_DIMS];
    const void *data;        /* points into the mmap; aligned to the element size */
    uint64_t nbytes;
    int shard;               /* index into the shard list */
} ds41_tensor;

typedef struct ds41_st ds41_st;

/* Header caps: a header larger than this is rejected before it is read. */
#define DS41_ST_MAX_HEADER (256u << 20)

/* path: a .safetensors file, or a directory holding model.safetensors.index.json
 * (sharded) or exactly one model.safetensors / *.safetensors file.
 * Only headers are read; tensor bytes are mapped, not touched. */
int ds41_st_open(const char *path, ds41_st **out, ds41_err *err);
void ds41_st_close(ds41_st *st);

/* Does DIR name a directory holding safetensors (an index or any *.safetensors file)?
 * Reads only the directory listing. */
int ds41_st_dir_has_tensors(const char *dir);

/* Parses one in-memory file image (header + data) — used by the fuzz harness.
 * The buffer must outlive the returned object. */
int ds41_st_open_buffer(const void *buf, size_t len, const char *label, ds41_st **out, ds41_err *err);

/* Replaces every shard's file mapping by a read-only copy in anonymous memory (2 MiB aligned,
 * MADV_HUGEPAGE advised), read with pread; tensor data pointers move with it. */
int ds41_st_copy_anon(ds41_st *st, ds41_err *err);
/* The same, but the bytes of a tensor t with skip(t, arg) != 0 are not read: they stay zero in the
 * copy, and pages that hold nothing else are never touched (no memory). Under MPI a rank skips
 * the other ranks' routed experts. skip NULL: every byte. */
int ds41_st_copy_anon_skip(ds41_st *st, int (*skip)(const ds41_tensor *t, void *arg), void *arg, ds41_err *err);
/* madvise(MADV_WILLNEED) on the pages of [p, p + n): start reading them in, do not wait. */
void ds41_st_willneed(const void *p, uint64_t n);

size_t ds41_st_count(const ds41_st *st);
const ds41_tensor *ds41_st_at(const ds41_st *st, size_t i);     /* sorted by name */
const ds41_tensor *ds41_st_find(const ds41_st *st, const char *name);  /* NULL if absent */
int ds41_st_shard_count(const ds41_st *st);
/* The shard and file offset of the n bytes at p, when they lie in one shard mapped from its file
 * (not a caller's buffer, not a ds41_st_copy_anon copy): 0, else -1. Lets a reader fetch a
 * tensor's bytes with its own I/O (Engram's prefetch) instead of faulting the mapping in. */
int ds41_st_locate(const ds41_st *st, const void *p, uint64_t n, int *shard, uint64_t *offset);
const char *ds41_st_shard_path(const ds41_st *st, int i);
uint64_t ds41_st_shard_bytes(const ds41_st *st, int i);

#endif
