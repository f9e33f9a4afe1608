/* libFuzzer harness for the safetensors header parser (src/format/safetensors.c).
 * Feeds each input to ds41_st_open_buffer as a whole file image. A rejected input
 * must come with a one-line message; an accepted one must satisfy every promise
 * the loader makes (sorted names, find agrees, views inside the image, aligned,
 * sizes consistent), and every byte of every view is read so that ASan checks the
 * bounds. Any violation aborts, which libFuzzer reports as a crash. */
#include "safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds41_st *st = NULL;
    ds41_err err;
    err.msg[0] = 0;
    if (ds41_st_open_buffer(data, size, "fuzz", &st, &err) != 0) {
        if (st || !err.msg[0] || strchr(err.msg, '\n') || strncmp(err.msg, "fuzz", 4) != 0) abort();
        return 0;
    }
    size_t n = ds41_st_count(st);
    if (ds41_st_shard_count(st) != 1 || ds41_st_shard_bytes(st, 0) != size) abort();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i++) {
        const ds41_tensor *t = ds41_st_at(st, i);
        if (!t || !t->name || ds41_st_find(st, t->name) != t || t->shard != 0) abort();
        if (i && strcmp(ds41_st_at(st, i - 1)->name, t->name) >= 0) abort();
        if ((unsigned)t->dtype >= DS41_DT_COUNT || t->ndim < 0 || t->ndim > DS41_MAX_DIMS) abort();
        uint64_t elems = 1, bytes;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) abort();
            if (__builtin_mul_overflow(elems, (uint64_t)t->shape[d], &elems)) elems = UINT64_MAX;
        }
        if (__builtin_mul_overflow(elems, (uint64_t)ds41_dtype_size(t->dtype), &bytes) ||
            bytes != t->nbytes)
            abort();
        const uint8_t *p = t->data;
        if (p < data + 8 || p > data + size || t->nbytes > (uint64_t)(data + size - p)) abort();
        if (t->nbytes && (uintptr_t)p % (uintptr_t)ds41_dtype_size(t->dtype)) abort();
        for (uint64_t k = 0; k < t->nbytes; k++) sink ^= p[k];
    }
    if (ds41_st_at(st, n) != NULL || ds41_st_find(st, "\x01 not a tensor") != NULL) abort();
    (void)sink;
    ds41_st_close(st);
    return 0;
}
