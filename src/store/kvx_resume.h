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
 *   36   4  stream_rows: 0 = the prefill node ran every layer (n_rings = n_layers); S > 0 = it
 *           ran the layers before the first decoder layer D only (--pd-decoder decode, docs/pd.md):
 *           n_rings = D, no context rows, and the stream below carries the block input of layer
 *           D for the last S positions (S = min(pos, W + (n_layers - D - 1)(W - 1)), every row
 *           a decoder layer's window or ring reaches), which the decode node runs the decoder on
 *   40   8  mh_pos0: position of the first context row (mh_pos0 + mh_rows = pos)
 *   48  64  Engram history: 16 int32 compressed ids (most recent first)
 *   112 12n per compressor: layer, ratio, dim (int32)
 *   then  rings     n_rings x slots x rec_bytes        (cache.h ds41_ring.rec, ring order)
 *         comp      per compressor: kv then score, ratio x dim FP32 each
 *         context   mh_rows x mh_width BF16 (the forward's BF16-rounded main_hidden rows)
 *         stream    stream_rows x hc x dim FP32 (the residual stream X), then stream_rows x hc FP32
 *                   (the mix `pre` the last encoder FFN hands to layer D's attention)
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
    /* the decoder split (stream_rows > 0): rings shipped (the first decoder layer D), values
     * per stream row (hc x dim + hc) and its rows (W + (n_layers - D - 1)(W - 1)); all 0: this
     * node takes no stream */
    int stream_layer, stream_width, stream_max;
} ds41_kvx_geom;

/* The scalars of a payload and where its bodies start (offsets into the payload). */
typedef struct ds41_kvx_resume {
    long long pos, mh_pos0;
    int ik_owner, mh_rows;
    int stream_rows;            /* 0: every layer's ring; > 0: the decoder split's stream rows */
    int32_t hist[16];
    size_t rings_off, comp_off, mh_off, stream_off;
} ds41_kvx_resume;

/* Payload bytes for g with mh_rows context rows and stream_rows stream rows (0: every ring);
 * 0 when g or the counts are out of range. */
size_t ds41_kvx_resume_bytes(const ds41_kvx_geom *g, int mh_rows, int stream_rows);
/* The stream rows a split payload at position pos carries: min(pos, g->stream_max). */
int ds41_kvx_stream_rows(const ds41_kvx_geom *g, long long pos);
/* Writes the head (the first DS41_KVX_RESUME_HEAD + 12 n_comp bytes) for r (r->stream_rows
 * picks the form); fills r's offsets. */
void ds41_kvx_resume_write_head(const ds41_kvx_geom *g, ds41_kvx_resume *r, uint8_t *out);
/* Checks payload p[n] against g and the expected position: 0 with r filled, or -1 with why
 * (one line naming the field and what was expected). */
int ds41_kvx_resume_parse(const uint8_t *p, size_t n, const ds41_kvx_geom *g, long long pos, ds41_kvx_resume *r,
                          char *why, size_t whycap);

#endif
