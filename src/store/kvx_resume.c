/* ds41 RESUME frame payload: see kvx_resume.h. */
#include "kvx_resume.h"

#include <stdio.h>
#include <string.h>

#include "le.h"

static int geom_ok(const ds41_kvx_geom *g) {
    if (g->n_rings < 1 || g->slots < 1 || g->rec_bytes < 1 || g->n_comp < 0 || g->n_comp > DS41_KVX_MAX_COMP ||
        g->n_layers < 1 || g->n_hist_ids < 0 || g->mh_width < 0 || g->stream_layer < 0 ||
        g->stream_layer > g->n_rings || g->stream_width < 0 || g->stream_max < 0 ||
        (g->stream_max > 0) != (g->stream_layer > 0 && g->stream_width > 0))
        return 0;
    for (int i = 0; i < g->n_comp; i++)
        if (g->comp_ratio[i] < 1 || g->comp_dim[i] < 1) return 0;
    return 1;
}

/* the body sizes in 64 bits: a geometry of ints cannot overflow them */
static uint64_t comp_bytes(const ds41_kvx_geom *g) {
    uint64_t n = 0;
    for (int i = 0; i < g->n_comp; i++) n += 2ull * (uint64_t)g->comp_ratio[i] * (uint64_t)g->comp_dim[i] * 4;
    return n;
}

/* the rings a payload carries: every layer's, or those before the first decoder layer */
static int rings_of(const ds41_kvx_geom *g, int stream_rows) { return stream_rows > 0 ? g->stream_layer : g->n_rings; }

static uint64_t total_bytes(const ds41_kvx_geom *g, int mh_rows, int stream_rows) {
    return DS41_KVX_RESUME_HEAD + 12ull * (uint64_t)g->n_comp +
           (uint64_t)rings_of(g, stream_rows) * (uint64_t)g->slots * (uint64_t)g->rec_bytes + comp_bytes(g) +
           (uint64_t)mh_rows * (uint64_t)g->mh_width * 2 + (uint64_t)stream_rows * (uint64_t)g->stream_width * 4;
}

size_t ds41_kvx_resume_bytes(const ds41_kvx_geom *g, int mh_rows, int stream_rows) {
    if (!geom_ok(g) || mh_rows < 0 || mh_rows > g->slots || stream_rows < 0 || stream_rows > g->stream_max ||
        (stream_rows > 0 && mh_rows > 0))
        return 0;
    uint64_t n = total_bytes(g, mh_rows, stream_rows);
    return n > (uint64_t)SIZE_MAX ? 0 : (size_t)n;
}

int ds41_kvx_stream_rows(const ds41_kvx_geom *g, long long pos) {
    return pos < (long long)g->stream_max ? (int)(pos > 0 ? pos : 0) : g->stream_max;
}

static void offsets(const ds41_kvx_geom *g, ds41_kvx_resume *r) {
    r->rings_off = DS41_KVX_RESUME_HEAD + 12 * (size_t)g->n_comp;
    r->comp_off = r->rings_off + (size_t)rings_of(g, r->stream_rows) * (size_t)g->slots * (size_t)g->rec_bytes;
    r->mh_off = r->comp_off + (size_t)comp_bytes(g);
    r->stream_off = r->mh_off + (size_t)r->mh_rows * (size_t)g->mh_width * 2;
}

void ds41_kvx_resume_write_head(const ds41_kvx_geom *g, ds41_kvx_resume *r, uint8_t *out) {
    memset(out, 0, DS41_KVX_RESUME_HEAD);
    ds41_put64(out, (uint64_t)r->pos);
    ds41_put32(out + 8, (uint32_t)rings_of(g, r->stream_rows));
    ds41_put32(out + 12, (uint32_t)g->slots);
    ds41_put32(out + 16, (uint32_t)g->rec_bytes);
    ds41_put32(out + 20, (uint32_t)g->n_comp);
    ds41_put32(out + 24, (uint32_t)r->ik_owner);
    ds41_put32(out + 28, (uint32_t)r->mh_rows);
    ds41_put32(out + 32, (uint32_t)g->mh_width);
    ds41_put32(out + 36, (uint32_t)r->stream_rows);
    ds41_put64(out + 40, (uint64_t)r->mh_pos0);
    for (int k = 0; k < 16; k++) ds41_put32(out + 48 + 4 * k, (uint32_t)r->hist[k]);
    for (int i = 0; i < g->n_comp; i++) {
        uint8_t *c = out + DS41_KVX_RESUME_HEAD + 12 * i;
        ds41_put32(c, (uint32_t)g->comp_layer[i]);
        ds41_put32(c + 4, (uint32_t)g->comp_ratio[i]);
        ds41_put32(c + 8, (uint32_t)g->comp_dim[i]);
    }
    offsets(g, r);
}

/* one field against what the receiver expects */
static int field(const char *name, long long got, long long want, char *why, size_t whycap) {
    if (got == want) return 0;
    snprintf(why, whycap, "RESUME payload: %s %lld (expected %lld)", name, got, want);
    return -1;
}

int ds41_kvx_resume_parse(const uint8_t *p, size_t n, const ds41_kvx_geom *g, long long pos, ds41_kvx_resume *r,
                          char *why, size_t whycap) {
    memset(r, 0, sizeof *r);
    if (!geom_ok(g)) { snprintf(why, whycap, "RESUME payload: this node's cache geometry is out of range"); return -1; }
    if (n < DS41_KVX_RESUME_HEAD) {
        snprintf(why, whycap, "RESUME payload of %zu bytes (the head alone is %d)", n, DS41_KVX_RESUME_HEAD);
        return -1;
    }
    r->pos = (long long)ds41_get64(p);
    r->ik_owner = (int32_t)ds41_get32(p + 24);
    uint32_t mh_rows = ds41_get32(p + 28);
    r->mh_pos0 = (long long)ds41_get64(p + 40);
    /* the form: every ring, or (the decoder split) the encoder's rings and the stream rows,
     * which a node without the split's geometry refuses */
    uint32_t srows = ds41_get32(p + 36);
    if (srows > 0 && g->stream_max == 0) {
        snprintf(why, whycap, "RESUME payload: %u decoder stream rows (this node takes no stream)", srows);
        return -1;
    }
    if (srows > 0 && field("decoder stream rows", srows, ds41_kvx_stream_rows(g, pos), why, whycap)) return -1;
    r->stream_rows = (int)srows;
    if (field("position", r->pos, pos, why, whycap) ||
        field("ring count", ds41_get32(p + 8), rings_of(g, r->stream_rows), why, whycap) ||
        field("ring slots", ds41_get32(p + 12), g->slots, why, whycap) ||
        field("ring record bytes", ds41_get32(p + 16), g->rec_bytes, why, whycap) ||
        field("compressor count", ds41_get32(p + 20), g->n_comp, why, whycap) ||
        field("context row width", ds41_get32(p + 32), g->mh_width, why, whycap))
        return -1;
    if (r->ik_owner < -1 || r->ik_owner >= g->n_layers) {
        snprintf(why, whycap, "RESUME payload: index-K owner %d (-1 .. %d)", r->ik_owner, g->n_layers - 1);
        return -1;
    }
    if (mh_rows > (uint32_t)g->slots || (mh_rows > 0 && g->mh_width == 0) ||
        (mh_rows > 0 && r->mh_pos0 != pos - (long long)mh_rows)) {
        snprintf(why, whycap, "RESUME payload: %u context rows from position %lld (at most %d, ending at %lld)", mh_rows,
                 r->mh_pos0, g->mh_width ? g->slots : 0, pos);
        return -1;
    }
    if (mh_rows > 0 && r->stream_rows > 0) {
        snprintf(why, whycap, "RESUME payload: %u context rows with a decoder stream (the decode node taps them)", mh_rows);
        return -1;
    }
    r->mh_rows = (int)mh_rows;
    for (int k = 0; k < 16; k++) {
        r->hist[k] = (int32_t)ds41_get32(p + 48 + 4 * k);
        if (r->hist[k] < 0 || (r->hist[k] > 0 && r->hist[k] >= g->n_hist_ids)) {
            snprintf(why, whycap, "RESUME payload: Engram history entry %d is %d (compressed ids 0 .. %d)", k, r->hist[k],
                     g->n_hist_ids - 1);
            return -1;
        }
    }
    size_t want = ds41_kvx_resume_bytes(g, r->mh_rows, r->stream_rows);
    if (n != want) {
        snprintf(why, whycap, "RESUME payload of %zu bytes (%d compressors, %d context rows, %d stream rows: %zu)", n,
                 g->n_comp, r->mh_rows, r->stream_rows, want);
        return -1;
    }
    for (int i = 0; i < g->n_comp; i++) {
        const uint8_t *c = p + DS41_KVX_RESUME_HEAD + 12 * i;
        if ((int32_t)ds41_get32(c) != g->comp_layer[i] || (int32_t)ds41_get32(c + 4) != g->comp_ratio[i] ||
            (int32_t)ds41_get32(c + 8) != g->comp_dim[i]) {
            snprintf(why, whycap, "RESUME payload: compressor %d is layer %d, ratio %d, dim %d (this node's: %d, %d, %d)", i,
                     (int32_t)ds41_get32(c), (int32_t)ds41_get32(c + 4), (int32_t)ds41_get32(c + 8), g->comp_layer[i],
                     g->comp_ratio[i], g->comp_dim[i]);
            return -1;
        }
    }
    offsets(g, r);
    return 0;
}
