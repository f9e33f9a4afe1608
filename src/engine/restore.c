/* ds41 prefix-cache restore: see restore.h. */
#include "restore.h"

#include <string.h>

long long ds41_seq_replay_rows(const ds41_config *cfg, int mode, long long M) {
    long long W = cfg->window, L = cfg->n_layers;
    long long R = mode == DS41_RESTORE_APPROX ? W : W + (L - 1) * (W - 1);
    return R < M ? R : M;
}

int ds41_restore_supported(const ds41_config *cfg) {
    for (int i = 0; i < cfg->n_kv_sources; i++) {
        int r = cfg->compress_ratios[cfg->kv_sources[i]];
        if (r < 1 || DS41_PAGE_TOKENS % r) return 0;
    }
    return 1;
}

int ds41_seq_restore(ds41_seq *s, const int32_t *ids, long long M, uint8_t *const *pages, int mode, int want_logits,
                     ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    ds41_cache *c = &s->cache;
    if (c->pos != 0) return ds41_errf(err, "restore: the sequence holds %lld tokens (needs a fresh one)", c->pos);
    if (M < DS41_PAGE_TOKENS || M % DS41_PAGE_TOKENS || M > c->max_pos)
        return ds41_errf(err, "restore: %lld tokens (whole %d-token blocks within the context %lld)", M,
                         DS41_PAGE_TOKENS, c->max_pos);
    if (mode != DS41_RESTORE_EXACT && mode != DS41_RESTORE_APPROX) return ds41_errf(err, "restore: mode %d", mode);
    if (!ds41_restore_supported(cfg)) return ds41_errf(err, "restore: a KV source's ratio does not divide %d", DS41_PAGE_TOKENS);
    for (long long i = 0; i < M; i++)
        if (ids[i] < 0 || ids[i] >= cfg->vocab_size)
            return ds41_errf(err, "restore: token id %d at position %lld is outside the vocabulary", ids[i], i);
    int nb = (int)(M / DS41_PAGE_TOKENS);
    for (int i = 0; i < c->n_stores; i++) {
        ds41_kv_store *st = &c->stores[i];
        for (int b = 0; b < nb; b++)
            if (ds41_store_attach_page(st, b, pages[(size_t)b * c->n_stores + i], err)) return -1;
        st->n_entries = M / st->ratio;
    }
    long long R = ds41_seq_replay_rows(cfg, mode, M), P0 = M - R;
    /* the state at the replay start: position, Engram history from the ids, the published
     * index-K owner a prefill of P0 tokens leaves (a one-shot prefill starts from none) */
    c->pos = P0;
    if (e->has_engram)
        for (int k = 0; k < 16; k++) c->hist[k] = P0 - 1 - k < 0 ? 0 : e->token_map[ids[P0 - 1 - k]];
    c->ik_owner = P0 > 0 ? ds41_ik_owner_after(cfg, -1, 0, P0 - 1, cfg->n_layers - 1) : -1;
    ds41_prefill_mode saved = s->prefill;
    s->prefill = DS41_PREFILL_RESTORE;
    s->restore = mode;
    int rc = ds41_forward(s, ids + P0, (int)R, want_logits, err);
    s->restore = 0;
    s->prefill = saved;
    return rc;
}
