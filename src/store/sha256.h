/* SHA-256 (FIPS 180-4): the content key of an image in the prefix cache (a chat re-sends its
 * pictures every turn; two different images must never share a cached block, so the key is a
 * cryptographic digest of the pixels the tower sees, not a fast hash). */
#ifndef DS41_SHA256_H
#define DS41_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct ds41_sha256 {
    uint32_t h[8];
    uint64_t len;          /* bytes hashed so far */
    uint8_t buf[64];
    size_t nbuf;
} ds41_sha256;

void ds41_sha256_init(ds41_sha256 *c);
void ds41_sha256_update(ds41_sha256 *c, const void *p, size_t n);
void ds41_sha256_final(ds41_sha256 *c, uint8_t out[32]);

#endif
