/* ds41 KV transfer frames (prefill/decode disaggregation, docs/pd.md): the wire format between
 * a decode node and a prefill node. Pure codec, no I/O: the transport (src/pd/) moves bytes,
 * this file says whether they are a frame.
 *
 * Frame, little-endian:
 *   0   4  magic "DKVX"
 *   4   2  version (2: RESUME added; 3: RESUME may carry the decoder stream instead of the
 *           decoder rings, kvx_resume.h; a peer of another version is refused at its first frame)
 *   6   2  type (DS41_KVX_*)
 *   8   8  request id (chosen by the decode node, echoed by every frame of the request)
 *   16  4  sequence number (0, 1, 2, ... per direction and request: a lost, repeated or
 *          reordered frame is caught)
 *   20  4  layer (LAYER frames: the KV source's layer id; else -1)
 *   24  4  arg0 (per type, below)
 *   28  4  arg1
 *   32  4  payload bytes N (at most DS41_KVX_MAX_PAYLOAD)
 *   36  4  CRC32C of bytes 0..35
 *   40  4  CRC32C of the payload (0 for N = 0)
 *   44  4  reserved (0)
 *   48  N  payload
 * The header checksum lets a reader trust N before it reads the payload, so a corrupt length
 * never makes it wait for bytes that will not come or allocate what it should not.
 *
 * Types (direction, arg0, arg1, payload):
 *   HELLO   d->p  0, 0, the compatibility hash (32 B)
 *   WELCOME p->d  active requests, capacity, the prefill node's compatibility hash (32 B)
 *   REQ     d->p  first block to ship, flags (DS41_KVX_REQ_*), the prompt ids (int32; at least
 *                 one whole block)
 *   LAYER   p->d  KV store index, first block, that store's pages of consecutive blocks
 *                 (a whole number of pages, in the paged layout of src/engine/cache.h)
 *   RESUME  p->d  0, 0, the bounded resume state at the last shipped block's end
 *                 (kvx_resume.h): after the last LAYER frame, before DONE, exactly once
 *   DONE    p->d  blocks shipped per store, number of stores, none
 *   ERROR   either  a DS41_KVX_E_* code, 0, a message (printable text)
 * The compatibility hash is the prefix cache's model fingerprint (checkpoint config, tensor
 * table and sampled bytes, exact/fast kernels, index-K reading): two nodes exchange KV pages
 * only when it is equal, as a prefix cache serves only blocks of its own fingerprint. */
#ifndef DS41_KVX_FRAME_H
#define DS41_KVX_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define DS41_KVX_MAGIC "DKVX"
#define DS41_KVX_VERSION 3
#define DS41_KVX_HEADER 48
#define DS41_KVX_MAX_PAYLOAD (256u << 20)
#define DS41_KVX_HASH 32

enum {
    DS41_KVX_HELLO = 1,
    DS41_KVX_WELCOME = 2,
    DS41_KVX_REQ = 3,
    DS41_KVX_LAYER = 4,
    DS41_KVX_DONE = 5,
    DS41_KVX_ERROR = 6,
    DS41_KVX_RESUME = 7,
};

/* REQ flags */
enum {
    DS41_KVX_REQ_CONTEXT = 1,  /* the decode node drafts: ship the DSpark context rows too */
};

/* ERROR codes */
enum {
    DS41_KVX_E_MISMATCH = 1,   /* compatibility hashes differ */
    DS41_KVX_E_BUSY = 2,       /* no room for another request */
    DS41_KVX_E_BAD = 3,        /* a malformed or unexpected frame */
    DS41_KVX_E_FAILED = 4,     /* the prefill itself failed */
};

typedef struct ds41_kvx_hdr {
    uint16_t version, type;
    uint64_t req;
    uint32_t seq;
    int32_t layer;
    uint32_t arg0, arg1;
    uint32_t len;              /* payload bytes */
    uint32_t pcrc;             /* payload checksum */
} ds41_kvx_hdr;

/* Writes the 48-byte header for h and payload (len bytes; h->pcrc is computed here) into out. */
void ds41_kvx_encode(const ds41_kvx_hdr *h, const void *payload, uint8_t out[DS41_KVX_HEADER]);

/* Checks a header: 0 and *h filled, or -1 with why (what is wrong, one line). max_payload: the
 * largest payload the reader accepts (<= DS41_KVX_MAX_PAYLOAD). */
int ds41_kvx_decode_header(const uint8_t in[DS41_KVX_HEADER], uint32_t max_payload, ds41_kvx_hdr *h, char *why,
                           size_t whycap);
/* Checks the payload against the header's checksum; 0 or -1 with why. */
int ds41_kvx_check_payload(const ds41_kvx_hdr *h, const void *payload, char *why, size_t whycap);

/* Checks that a decoded frame is what a reader expects next: its type (one of the `allowed`
 * types, a bit mask of 1 << type), the request id and the sequence number. 0 or -1 with why. */
int ds41_kvx_expect(const ds41_kvx_hdr *h, unsigned allowed, uint64_t req, uint32_t seq, char *why, size_t whycap);

/* A whole frame in memory (header + payload): decode_header, the size and check_payload.
 * *payload points inside data. 0 or -1 with why. (What fuzz/fuzz_kvx.c drives.) */
int ds41_kvx_parse(const uint8_t *data, size_t n, uint32_t max_payload, ds41_kvx_hdr *h, const uint8_t **payload,
                   char *why, size_t whycap);

const char *ds41_kvx_type_name(unsigned type);

#endif
