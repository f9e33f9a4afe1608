/* ds41 forward pass under --split layers: what crosses a stage boundary that is not at a KV
 * source besides the residual stream (fwd_attn.h ds41_fwd_cut_*, dist_stage.h ds41_cut_need,
 * docs/distributed.md "Stage boundaries that are not KV sources").
 *
 * The layers from the cut on read, of the layers before it, the global entries of a KV source
 * (attention: its main KV; an indexer: its index keys), the top-k lists of an index source
 * (a Reuse layer's list) and the candidate pool (a Reindex layer's filter). The stage before
 * the cut holds them after its layers ran (computed there, or received at its own first layer),
 * packs them per sequence behind the stream's rows, and the stage after writes the entries
 * into its replica of the source's store and the lists and pool into the sequence's forward
 * scratch, where its layers read them exactly as one process reads its own: the same bytes.
 *
 * Layout per sequence of the forward, in order (the length follows from the forward's plan
 * alone, so both stages know it): for each store crossing (kv_sources order), unless the
 * sequence replays a restored prefix (its entries are restored on both stages), the records
 * of entries [P / r, (P + T) / r), each main-KV record then its index-K record; for each layer
 * m whose lists cross, a 4-byte width w (0 when its indexer did not run for the sequence, else
 * kmax) and T x kmax ids, kmax = min(index_topk, (P + T) / r_m); for the pool, a 4-byte count
 * of blocks nb (0: none built) and T rows of ceil(nbmax / 8) bytes, one bit per block
 * (nbmax = ceil(((P + T) / r_c) / candidate_block_size)). */
#include "fwd_attn.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dist_stage.h"

static long long sel_kmax(const ds41_config *cfg, int m, long long P, int T) {
    int r = cfg->layers[m].ratio > 0 ? cfg->layers[m].ratio : 1;
    long long E = (P + T) / r;
    return E < cfg->index_topk ? E : cfg->index_topk;
}

static long long pool_nbmax(const ds41_config *cfg, long long P, int T) {
    int c = cfg->candidate_source;
    int r = c >= 0 && cfg->layers[c].ratio > 0 ? cfg->layers[c].ratio : 1;
    long long B = cfg->candidate_block_size > 0 ? cfg->candidate_block_size : 1, E = (P + T) / r;
    return (E + B - 1) / B;
}

/* The bytes of sequence i's part. */
static size_t seq_bytes(const fwd_seqs *fs, int i, const ds41_cut_need *nd) {
    const ds41_seq *s = fs->ss[i];
    const ds41_config *cfg = s->e->cfg;
    long long P = s->cache.pos;
    int T = fs->T[i];
    size_t n = 0;
    for (int k = 0; k < cfg->n_kv_sources && !s->restore; k++) {
        if (!nd->stores[k]) continue;
        const ds41_kv_store *st = &s->cache.stores[k];
        n += (size_t)((P + T) / st->ratio - P / st->ratio) * (size_t)(st->kv_bytes + st->ik_bytes);
    }
    for (int m = 0; m < nd->layer && m < DS41_CUT_MAX_LAYERS; m++)
        if (nd->sel[m]) n += 4 + (size_t)T * (size_t)sel_kmax(cfg, m, P, T) * sizeof(int32_t);
    if (nd->pool) n += 4 + (size_t)T * (size_t)((pool_nbmax(cfg, P, T) + 7) / 8);
    return n;
}

size_t ds41_fwd_cut_size(const fwd_seqs *fs, const ds41_cut_need *nd) {
    size_t n = 0;
    if (!nd || !nd->n) return 0;
    for (int i = 0; i < fs->count; i++) n += seq_bytes(fs, i, nd);
    return n;
}

int ds41_fwd_cut_pack(const fwd_seqs *fs, const ds41_cut_need *nd, uint8_t *out, ds41_err *err) {
    uint8_t *o = out;
    for (int i = 0; i < fs->count; i++) {
        ds41_seq *s = fs->ss[i];
        const ds41_config *cfg = s->e->cfg;
        const seq_part *sp = fs->v[i].sp;
        long long P = s->cache.pos;
        int T = fs->T[i];
        for (int k = 0; k < cfg->n_kv_sources && !s->restore; k++) {
            if (!nd->stores[k]) continue;
            ds41_kv_store *st = &s->cache.stores[k];
            if (st->n_entries < (P + T) / st->ratio)
                return ds41_errf(err, "--split layers: the store of layer %d holds %lld entries, the cut in front of layer "
                                 "%d sends up to %lld", st->layer, st->n_entries, nd->layer, (P + T) / st->ratio);
            for (long long j = P / st->ratio; j < (P + T) / st->ratio; j++) {
                const uint8_t *kr = ds41_store_kv_rec(st, j, 0, err), *ir = ds41_store_ik_rec(st, j, 0, err);
                if (!kr || !ir) return -1;
                memcpy(o, kr, (size_t)st->kv_bytes), o += st->kv_bytes;
                memcpy(o, ir, (size_t)st->ik_bytes), o += st->ik_bytes;
            }
        }
        for (int m = 0; m < nd->layer && m < DS41_CUT_MAX_LAYERS; m++) {
            if (!nd->sel[m]) continue;
            long long kmax = sel_kmax(cfg, m, P, T);
            int32_t w = sp->sel_w[m];
            if (w != 0 && w != kmax)
                return ds41_errf(err, "--split layers: layer %d's top-k lists are %d wide, the cut in front of layer %d "
                                 "expects %lld", m, w, nd->layer, kmax);
            memcpy(o, &w, 4), o += 4;
            size_t nb = (size_t)T * (size_t)kmax * sizeof(int32_t);
            if (w) memcpy(o, sp->sel[m], nb);
            else memset(o, 0xff, nb);
            o += nb;
        }
        if (nd->pool) {
            long long nbmax = pool_nbmax(cfg, P, T), rb = (nbmax + 7) / 8;
            int32_t nb = sp->pool_nb;
            if (nb != 0 && nb != nbmax)
                return ds41_errf(err, "--split layers: the candidate pool has %d blocks, the cut in front of layer %d "
                                 "expects %lld", nb, nd->layer, nbmax);
            memcpy(o, &nb, 4), o += 4;
            memset(o, 0, (size_t)(T * rb));
            for (int t = 0; nb && t < T; t++)
                for (int b = 0; b < nb; b++)
                    if (sp->pool[(size_t)t * nb + b]) o[(size_t)t * rb + b / 8] |= (uint8_t)(1u << (b % 8));
            o += (size_t)(T * rb);
        }
    }
    return 0;
}

int ds41_fwd_cut_unpack(const fwd_seqs *fs, const ds41_cut_need *nd, const uint8_t *in, ds41_err *err) {
    const uint8_t *o = in;
    for (int i = 0; i < fs->count; i++) {
        ds41_seq *s = fs->ss[i];
        const ds41_config *cfg = s->e->cfg;
        seq_part *sp = fs->v[i].sp;
        long long P = s->cache.pos;
        int T = fs->T[i];
        for (int k = 0; k < cfg->n_kv_sources; k++) {
            if (!nd->stores[k]) continue;
            ds41_kv_store *st = &s->cache.stores[k];
            long long j0 = P / st->ratio, j1 = (P + T) / st->ratio;
            /* the published index-K owner moves as the source's compressor (or, in a replay,
             * its restored entries) moved it */
            if (j1 > j0) s->cache.ik_owner = st->layer;
            if (s->restore) {   /* restored on this stage too (ds41_store_here) */
                if (st->n_entries < j1)
                    return ds41_errf(err, "--split layers: the replica of layer %d holds %lld restored entries, the "
                                     "replay needs %lld", st->layer, st->n_entries, j1);
                continue;
            }
            for (long long j = j0; j < j1; j++) {
                uint8_t *kr = ds41_store_kv_rec(st, j, 1, err), *ir = kr ? ds41_store_ik_rec(st, j, 1, err) : NULL;
                if (!kr || !ir) return -1;
                memcpy(kr, o, (size_t)st->kv_bytes), o += st->kv_bytes;
                memcpy(ir, o, (size_t)st->ik_bytes), o += st->ik_bytes;
            }
            st->n_entries = j1;
        }
        for (int m = 0; m < nd->layer && m < DS41_CUT_MAX_LAYERS; m++) {
            if (!nd->sel[m]) continue;
            long long kmax = sel_kmax(cfg, m, P, T);
            int32_t w;
            memcpy(&w, o, 4), o += 4;
            size_t nb = (size_t)T * (size_t)kmax * sizeof(int32_t);
            if (w != 0 && w != kmax)
                return ds41_errf(err, "--split layers: the stage before sent layer %d's top-k lists %d wide, expected %lld",
                                 m, w, kmax);
            if (w) {
                if (ds41_fwd_grow((void **)&sp->sel[m], &sp->sel_cap[m], (size_t)T * (size_t)kmax, sizeof(int32_t)))
                    return ds41_errf(err, "out of memory");
                memcpy(sp->sel[m], o, nb);
            }
            sp->sel_w[m] = w;
            o += nb;
        }
        if (nd->pool) {
            long long nbmax = pool_nbmax(cfg, P, T), rb = (nbmax + 7) / 8;
            int32_t nb;
            memcpy(&nb, o, 4), o += 4;
            if (nb != 0 && nb != nbmax)
                return ds41_errf(err, "--split layers: the stage before sent a candidate pool of %d blocks, expected %lld",
                                 nb, nbmax);
            if (nb) {
                if (ds41_fwd_grow((void **)&sp->pool, &sp->pool_cap, (size_t)T * (size_t)nb, 1))
                    return ds41_errf(err, "out of memory");
                for (int t = 0; t < T; t++)
                    for (int b = 0; b < nb; b++)
                        sp->pool[(size_t)t * nb + b] = (o[(size_t)t * rb + b / 8] >> (b % 8)) & 1;
            }
            sp->pool_nb = nb;
            o += (size_t)(T * rb);
        }
    }
    return 0;
}
