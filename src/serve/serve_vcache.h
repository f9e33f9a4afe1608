/* ds41 serve: the image embedding cache (docs/vision.md, "Prefix cache"). The span rows of
 * recently encoded images (the tower and aligner's output with the start / newline / end
 * vectors: what the prefill and a prefix-cache restore's replay read), keyed by the image's
 * content key (SHA-256 of its preprocessed size and pixels, ds41_image_prepare), bounded in
 * bytes, least recently used first out. An image seen again (a chat that re-sends its picture
 * each turn) then needs no tower: its rows are the ones the tower gave, bit for bit. Shared by
 * the encoding threads (serve_vision.h): every call takes the cache's mutex. */
#ifndef DS41_SERVE_VCACHE_H
#define DS41_SERVE_VCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ds41_vcache ds41_vcache;

typedef struct ds41_vcache_stats {
    long long encoded;     /* images that ran through the tower */
    long long reused;      /* images whose rows came from the cache */
    long long evicted;     /* entries dropped for room */
    long long entries, bytes;
    long long max_bytes;
} ds41_vcache_stats;

/* max_bytes: the rows held at most (an image larger than that is not kept). NULL: out of
 * memory. */
ds41_vcache *ds41_vcache_new(long long max_bytes);
void ds41_vcache_free(ds41_vcache *c);
/* 1: the rows of the image with this key, copied into a new *span ([*rows][dim] floats, the
 * caller frees it), counted as reused and made the most recent; 0: not held (or out of
 * memory). dim must be the width the rows were put with. */
int ds41_vcache_get(ds41_vcache *c, const uint8_t key[32], int dim, float **span, int *rows);
/* Counts an encoded image and keeps a copy of its rows (span [rows][dim]), evicting the least
 * recently used entries while the bytes exceed the bound. */
void ds41_vcache_put(ds41_vcache *c, const uint8_t key[32], int dim, const float *span, int rows);
void ds41_vcache_get_stats(ds41_vcache *c, ds41_vcache_stats *out);

#endif
