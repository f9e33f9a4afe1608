/* ds41 KV transfer: the RESUME frame's payload (docs/pd.md), the bounded state a sequence holds
 * besides its global KV at a block end, so that a decode node installs it and replays nothing.
 * Pure codec like kvx_frame.h: layout, size and checks against the geometry the receiver's own
 * cache has; the engine side (src/pd/pd_resume.c) fills and reads the bodies.
 *
 * Payload, little-endian:
 *   0    8  pos: the tokens the state follows (M, a whole number of blocks)
 *   8    4  n_rings: the layers' SWA rings (n_layers; the DSpark rings are seeded from the
 *           context rows below by the decode node, as after any prefill)
 *   12   4  slots per ring (the window)
 *   16   4  record bytes per slot (528 at production)
 *   20   4  n_comp: compressors with ratio > 1
 *   24   4  ik_owner: the published index-K owner (-1 .. n_layers - 1)
 *   28   4  mh_rows: DSpark context input rows (0 .. slots; 0 when not asked for)
 *   32   4  mh_width: values per context row (n_dspark_targets x dim)
 *   36   4  reserved (0)
 *   40   8  mh_pos0: position of the first context row (mh_pos0 + mh_rows = pos)
 *   48  64  Engram history: 16 int32 compressed ids (most recent first)
 *   112 12n per compressor: layer, ratio, dim (int32)
 *   then  rings     n_rings x slots x rec_bytes        (cache.h ds41_ring.rec, ring order)
 *         comp      per compressor: kv then score, ratio x dim FP32 each
 *         context   mh_rows x mh_width BF16 (the forward's BF16-rounded main_hidden rows)
 * The frame's CRC32C guards the bytes; these checks guard the meaning (a peer with another
 * build, a bug), and a payload that passes them is one the receiver can install as is. */
#ifndef DS41_KVX_RESUME_H
#define DS41_KVX_RESUME_H

#include <stddef.h>
#include <stdint.h>

#define DS41_KVX_RESUME_HEAD 112
#define DS41_KVX_MAX_COMP 16

/* What the receiver's cache looks like (and so what a payload must say). */
typedef struct ds41_kvx_geom {
    int n_rings, slots, rec_bytes;
    int n_comp;
    int comp_layer[DS41_KVX_MAX_COMP], comp_ratio[DS41_KVX_MAX_COMP], comp_dim[DS41_KVX_MAX_COMP];
    int n_layers;               /* ik_owner's range */
    int n_hist_ids;             /* Engram compressed ids: each history entry < this (0: no Engram, all 0) */
    int mh_width;               /* n_dspark_targets x dim (0: no DSpark) */
} ds41_kvx_geom;

/* The scalars of a payload and where its bodies start (offsets into the payload). */
typedef struct ds41_kvx_resume {
    long long pos, mh_pos0;
    int ik_owner, mh_rows;
    int32_t hist[16];
    size_t rings_off, comp_off, mh_off;
} ds41_kvx_resume;

/* Payload bytes for g with mh_rows context rows; 0 when g is out of range. */
size_t ds41_kvx_resume_bytes(const ds41_kvx_geom *g, int mh_rows);
/* Writes the head (the first DS41_KVX_RESUME_HEAD + 12 n_comp bytes) for r; fills r's offsets. */
void ds41_kvx_resume_write_head(const ds41_kvx_geom *g, ds41_kvx_resume *r, uint8_t *out);
/* Checks payload p[n] against g and the expected position: 0 with r filled, or -1 with why
 * (one line naming the field and what was expected). */
int ds41_kvx_resume_parse(const uint8_t *p, size_t n, const ds41_kvx_geom *g, long long pos, ds41_kvx_resume *r,
                          char *why, size_t whycap);

#endif
