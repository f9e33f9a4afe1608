/* ds41 library API (include/ds41.h) over the engine/sequence of forward.h, plus the
 * conformance trace writer (docs/conformance.md). */
#include "ds41.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "attention.h"
#include "dist.h"
#include "dist_pipe.h"
#include "dspark.h"
#include "engram_place.h"
#include "forward.h"
#include "longctx.h"
#include "lproc.h"
#include "restore.h"
#include "sampler.h"
#include "spec.h"
#include "tokenizer.h"

struct ds41_session {
    ds41_engine *e;
    ds41_seq seq;
    ds41_session_params p;
    ds41_sampler sampler;
    ds41_sampler sampler0;   /* as set by ds41_session_set_sampling: reset restarts from it */
    float *sscratch;
    int *iscratch;
    float *prow;             /* the processed logits row (allocated with the first processor) */
    int broken;
    int sampled;             /* serve --dp-attention: rank 0's copy holds the owner's token (next) */
    int32_t next;
    char err[1024];
    /* trace */
    char *trace_dir;
    FILE *t_tokens, *t_logits, *t_dspark_i, *t_dspark_f;
    ds41_trace trace;
    /* speculative decoding (spec.c): allocated on the first step; spec.pending always valid */
    ds41_spec_state spec;
    int spec_ready;
    ds41_dspark_work *dwork;   /* the proposals' scratch: allocated on the first, then reused */
    /* Deferred DSpark seeding (--spec auto): while the drafting gate is dormant no proposal
     * reads the stage rings, so the context rows of the fed positions wait here instead of
     * being written each step: the last `window` of them (a circular buffer of `window` rows
     * of n_dspark_targets * dim floats: row i of the dpend_n, position dpend_pos0 + i, in slot
     * (dpend_head + i) mod window, so that a step copies one row, not the window), written in
     * one ds41_dspark_seed before the next proposal,
     * verify or digest. The rings then hold exactly what seeding every step writes (a ring
     * keeps only its last `window` positions; rows are computed independently), so drafts,
     * outputs and digests do not change; a dormant session skips 3 % of a demo decode step. */
    float *dpend;
    int dpend_n, dpend_head;
    long long dpend_pos0;
    /* serve --split layers: a verify block whose forward ran in a pipelined step and whose
     * acceptance and rollback wait for the step's end (ds41_batch_end): its tokens */
    int vend;
    int32_t vend_blk[DS41_SPEC_MAX_DRAFTS + 1];
};

/* Reverses the order of rows [i, j) of w floats each, in place. */
static void rows_reverse(float *b, size_t w, int i, int j) {
    for (j--; i < j; i++, j--) {
        float *x = b + (size_t)i * w, *y = b + (size_t)j * w;
        for (size_t k = 0; k < w; k++) {
            float t = x[k];
            x[k] = y[k];
            y[k] = t;
        }
    }
}

/* Writes the deferred context rows into the rings (see dpend). */
static int seed_flush(ds41_session *s, ds41_err *err) {
    if (s->dpend_n <= 0) return 0;
    const ds41_config *cfg = s->e->cfg;
    int n = s->dpend_n, W = cfg->window, h = s->dpend_head;
    size_t w = (size_t)cfg->n_dspark_targets * cfg->dim;
    s->dpend_n = 0;
    s->dpend_head = 0;
    if (h + n > W) {
        /* wrapped: rotate the buffer into position order in place (slot h to row 0; three
         * reversals), once per flush. A copy into a new buffer (147 KB on the demo model:
         * above glibc's mmap threshold) faulted its 36 pages in at every flush. */
        rows_reverse(s->dpend, w, 0, h);
        rows_reverse(s->dpend, w, h, W);
        rows_reverse(s->dpend, w, 0, W);
        h = 0;
    }
    return ds41_dspark_seed(s->e, &s->seq.cache, s->dpend + (size_t)h * w, n, s->dpend_pos0, err);
}

/* After a forward outside a verify: the DSpark rings get the forward's context rows now, or
 * (a dormant --spec auto gate) later, through dpend. */
static int seed_rows(ds41_session *s, ds41_err *err) {
    ds41_seq *q = &s->seq;
    if (!s->p.draft) return 0;
    const ds41_config *cfg = s->e->cfg;
    int W = cfg->window;
    size_t w = (size_t)cfg->n_dspark_targets * cfg->dim;
    if (s->spec_ready && s->spec.dormant && q->mh_rows > 0 && q->main_hidden && W > 0 && !s->dpend)
        s->dpend = malloc((size_t)W * w * sizeof(float));   /* on failure: seed now, as before */
    if (!(s->spec_ready && s->spec.dormant && s->dpend) || q->mh_rows <= 0 || !q->main_hidden) {
        if (seed_flush(s, err)) return -1;
        return ds41_dspark_seed(s->e, &q->cache, q->main_hidden, q->mh_rows, q->mh_pos0, err);
    }
    /* the pending rows must end where these start (they always do: nothing between two plain
     * forwards moves the position backwards without a flush or reset) */
    if (s->dpend_n > 0 && s->dpend_pos0 + s->dpend_n != q->mh_pos0 && seed_flush(s, err)) return -1;
    int m = q->mh_rows;
    const float *src = q->main_hidden;
    long long p0 = q->mh_pos0;
    if (m > W) { src += (size_t)(m - W) * w; p0 += m - W; m = W; }
    if (s->dpend_n == 0) { s->dpend_pos0 = p0; s->dpend_head = 0; }
    for (int i = 0; i < m; i++) {
        if (s->dpend_n == W) {   /* full: the oldest row leaves */
            s->dpend_head = (s->dpend_head + 1) % W;
            s->dpend_n--;
            s->dpend_pos0++;
        }
        int slot = (s->dpend_head + s->dpend_n) % W;
        memcpy(s->dpend + (size_t)slot * w, src + (size_t)i * w, w * sizeof(float));
        s->dpend_n++;
    }
    return 0;
}

/* seed_flush for the callers outside a feed: an error breaks the session. */
static int seed_settle(ds41_session *s) {
    ds41_err err;
    if (!seed_flush(s, &err)) return 0;
    snprintf(s->err, sizeof s->err, "%s", err.msg);
    s->broken = 1;
    return -1;
}

void ds41_load_params_default(ds41_load_params *p) {
    memset(p, 0, sizeof *p);
    p->n_threads = 1;
}

void ds41_session_params_default(ds41_session_params *p) { memset(p, 0, sizeof *p); }

static void copy_err(char *dst, size_t cap, const char *msg) {
    if (dst && cap) snprintf(dst, cap, "%s", msg);
}

/* Engram token map: DIR/engram_token_map.i32 as is, else built from the tokenizer. */
static int load_token_map(const char *dir, const ds41_config *cfg, int32_t **map, int *n_comp, ds41_err *err) {
    char *path = ds41_path_join(dir, "engram_token_map.i32");
    if (!path) return ds41_errf(err, "out of memory");
    struct stat sb;
    if (stat(path, &sb) == 0) {
        char *buf;
        size_t len;
        int rc = ds41_read_file(path, (size_t)cfg->vocab_size * 4 + 1, &buf, &len, err);
        if (rc) { free(path); return -1; }
        if (len != (size_t)cfg->vocab_size * 4) {
            free(buf);
            ds41_errf(err, "%s: %zu bytes, expected vocab_size x 4 = %lld", path, len, (long long)cfg->vocab_size * 4);
            free(path);
            return -1;
        }
        int32_t *m = malloc(len);
        if (!m) { free(buf); free(path); return ds41_errf(err, "out of memory"); }
        int mx = -1;
        for (int i = 0; i < cfg->vocab_size; i++) {
            const unsigned char *b = (const unsigned char *)buf + 4 * (size_t)i;
            int32_t v = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
            if (v < 0 || v >= cfg->engram_compressed_vocab) {
                ds41_errf(err, "%s: entry %d is %d, outside 0..%d (engram_compressed_vocab_size - 1)", path, i, v,
                          cfg->engram_compressed_vocab - 1);
                free(m); free(buf); free(path);
                return -1;
            }
            m[i] = v;
            if (v > mx) mx = v;
        }
        free(buf);
        free(path);
        *map = m;
        *n_comp = mx + 1;
        return 0;
    }
    free(path);
    char *tpath = ds41_path_join(dir, "tokenizer.json");
    if (!tpath) return ds41_errf(err, "out of memory");
    int have_tok = stat(tpath, &sb) == 0;
    free(tpath);
    if (!have_tok)
        return ds41_errf(err, "%s: the config has %d Engram layers but the directory holds neither "
                         "engram_token_map.i32 nor tokenizer.json to build it from", dir, cfg->n_engram_layers);
    ds41_tokenizer *tok;
    if (ds41_tokenizer_load(dir, &tok, err)) return -1;
    /* a tokenizer with ids past the embedding table is another model's: building (and
     * caching) a map from its first vocab_size ids would silently give a wrong map */
    if (ds41_tokenizer_vocab_size(tok) > cfg->vocab_size) {
        ds41_errf(err, "%s/tokenizer.json has ids up to %d but vocab_size is %d: it does not belong to this checkpoint",
                  dir, ds41_tokenizer_vocab_size(tok) - 1, cfg->vocab_size);
        ds41_tokenizer_free(tok);
        return -1;
    }
    int rc = ds41_engram_token_map(dir, tok, cfg->vocab_size, map, n_comp, err);
    ds41_tokenizer_free(tok);
    return rc;
}

/* --load copy in an MPI job: the other ranks' routed experts are not copied */
static int copy_skip(const ds41_tensor *t, void *arg) {
    const ds41_model *m = arg;
    return ds41_dist_not_mine(&m->cfg, t->name);
}

static ds41_engine *load_local(const char *dir, const ds41_load_params *p, char *errbuf, size_t errcap) {
    ds41_load_params def;
    if (!p) { ds41_load_params_default(&def); p = &def; }
    ds41_err err;
    ds41_model *m = calloc(1, sizeof *m);
    ds41_engine *e = calloc(1, sizeof *e);
    int32_t *map = NULL;
    int n_comp = 0;
    if (!m || !e) { copy_err(errbuf, errcap, "out of memory"); free(m); free(e); return NULL; }
    if (ds41_model_open_load(dir, m, p->load == DS41_LOAD_COPY, ds41_dist_size() > 1 ? copy_skip : NULL, m, &err))
        goto fail_model;
    /* checked before the token map, so a config-only directory is reported as such rather
     * than as lacking engram_token_map.i32 */
    if (!m->st) { ds41_errf(&err, "%s: the checkpoint holds no tensors (config.json only)", dir); goto fail_open; }
    if (m->cfg.n_engram_layers > 0 && load_token_map(dir, &m->cfg, &map, &n_comp, &err)) goto fail_open;
    long long ctx = p->ctx_size > 0 ? p->ctx_size : 4096;
    if (p->ctx_size <= 0 && ctx > m->cfg.max_position_embeddings) ctx = m->cfg.max_position_embeddings;
    if (ds41_engine_init(e, m, 1, p->exact, p->n_threads, ctx, map, n_comp, &err)) {
        ds41_engine_free(e);   /* closes the model and frees the map */
        free(e);
        copy_err(errbuf, errcap, err.msg);
        return NULL;
    }
    if (ds41_engine_engram_place(e, p->engram_mode, p->engram_cache, p->load == DS41_LOAD_COPY, p->engram_verbose,
                                 &err)) {
        ds41_engine_free(e);
        free(e);
        copy_err(errbuf, errcap, err.msg);
        return NULL;
    }
    if (p->readahead && p->load != DS41_LOAD_COPY && ds41_engine_readahead_init(e, &err)) {
        ds41_engine_free(e);
        free(e);
        copy_err(errbuf, errcap, err.msg);
        return NULL;
    }
    return e;
fail_open:
    ds41_model_close(m);
fail_model:
    free(m);
    free(e);
    free(map);
    copy_err(errbuf, errcap, err.msg);
    return NULL;
}

/* Under mpiexec every rank loads, then joins the job (dist.h): a rank that failed or holds
 * another checkpoint, flag set or kernel mode is named by rank 0 and every rank returns the
 * same error; otherwise the routed experts go through the job's dispatch and each forward
 * checks its plan against rank 0's. */
ds41_engine *ds41_load(const char *dir, const ds41_load_params *p, char *errbuf, size_t errcap) {
    ds41_engine *e = load_local(dir, p, errbuf, errcap);
    if (ds41_dist_size() < 2) return e;
    ds41_dist_ident id;
    int exact = p ? p->exact : 0;
    if (ds41_dist_ident_of(dir, e ? e->model->st : NULL, exact, &id)) memset(&id, 0, sizeof id);
    const ds41_moe_dispatch *moe = NULL;
    char derr[2048];
    /* this rank's Engram rows, before the check: a shard it cannot read fails the job there */
    const ds41_engram_src *eg = NULL;
    if (e && e->has_engram && !ds41_pipe_on() &&
        ds41_dist_engram_open(e->cfg, e->w, e->model->st, e->eg_mode == DS41_EG_RAM && !e->eg_ram, e->eio, &eg, errbuf,
                              errcap)) {
        ds41_unload(e);
        e = NULL;
    }
    if (ds41_dist_join(e ? e->cfg : NULL, e ? e->w : NULL, &id, e ? NULL : errbuf, &moe, derr, sizeof derr)) {
        ds41_unload(e);
        copy_err(errbuf, errcap, derr);
        return NULL;
    }
    e->step = ds41_dist_step;
    if (ds41_pipe_on()) {   /* --split layers: each rank its stage, with the local MoE and its own Engram tables */
        if (ds41_pipe_open(e->cfg, &e->pipe, derr, sizeof derr)) {
            ds41_unload(e);
            copy_err(errbuf, errcap, derr);
            return NULL;
        }
        e->step = ds41_pipe_step;   /* the plan's hash also travels with the stream */
        return e;
    }
    e->ctx.moe = moe;
    e->eg_src = eg;
    return e;
}

void ds41_unload(ds41_engine *e) {
    if (!e) return;
    ds41_engine_free(e);
    free(e);
}

int ds41_vocab_size(const ds41_engine *e) { return e->cfg->vocab_size; }
long long ds41_ctx_size(const ds41_engine *e) { return e->max_pos; }

ds41_session *ds41_session_open(ds41_engine *e, const ds41_session_params *p, char *errbuf, size_t errcap) {
    ds41_session *s = calloc(1, sizeof *s);
    if (!s) { copy_err(errbuf, errcap, "out of memory"); return NULL; }
    if (p) s->p = *p;
    else ds41_session_params_default(&s->p);
    if (s->p.prefill < 0 || s->p.prefill > 2 || s->p.chunk < DS41_CHUNK_OFF || s->p.index_k < 0 || s->p.index_k > 1) {
        copy_err(errbuf, errcap, "invalid session parameters");
        free(s);
        return NULL;
    }
    if (e->pipe && s->p.index_k == DS41_INDEX_K_OFFICIAL) {   /* its published owner may live on another stage */
        copy_err(errbuf, errcap, "--index-k official is not supported with --split layers (use own, the default)");
        free(s);
        return NULL;
    }
    s->e = e;
    s->spec.pending = -1;
    ds41_err err;
    if (ds41_seq_init(&s->seq, e, &err)) { copy_err(errbuf, errcap, err.msg); free(s); return NULL; }
    s->seq.index_k_official = s->p.index_k == DS41_INDEX_K_OFFICIAL;
    if (s->p.draft && ds41_draft_block_size(e) == 0) {
        copy_err(errbuf, errcap, "the model has no DSpark stages to draft with");
        ds41_session_close(s);
        return NULL;
    }
    s->sscratch = malloc((size_t)e->cfg->vocab_size * sizeof(float));
    s->iscratch = malloc((size_t)e->cfg->vocab_size * sizeof(int));
    if (!s->sscratch || !s->iscratch) {
        copy_err(errbuf, errcap, "out of memory");
        ds41_session_close(s);
        return NULL;
    }
    ds41_session_set_sampling(s, 0.0f, 0, 1.0f, 0.0f, 0);
    return s;
}

void ds41_session_close(ds41_session *s) {
    if (!s) return;
    if (s->trace_dir) ds41_session_trace_finish(s);
    ds41_seq_free(&s->seq);
    ds41_spec_state_free(&s->spec);
    ds41_dspark_work_free(s->dwork);
    free(s->dpend);
    free(s->sscratch);
    free(s->iscratch);
    free(s->prow);
    free(s);
}

/* Everything a fresh session starts from, except the allocations (KV pages, rings, scratch)
 * and the parameters: the cache, the last logits, the DSpark context rows, the statistics and
 * the sampler's random stream, so that the same calls give bit-identical results. */
void ds41_session_reset(ds41_session *s) {
    ds41_seq *q = &s->seq;
    ds41_cache_reset(&q->cache);
    memset(q->logits, 0, (size_t)s->e->cfg->vocab_size * sizeof(float));
    q->lg_unshared = 0;
    free(q->main_hidden);
    q->main_hidden = NULL;
    q->mh_rows = 0;
    q->mh_pos0 = 0;
    q->rows_computed = q->rows_full = 0;
    s->sampler = s->sampler0;
    s->spec.pending = -1;
    s->dpend_n = s->dpend_head = 0;
    s->broken = 0;
    s->sampled = 0;
    s->err[0] = 0;
}

long long ds41_session_pos(const ds41_session *s) { return s->seq.cache.pos; }
const char *ds41_session_error(const ds41_session *s) { return s->err; }

int ds41_session_synthetic_context(ds41_session *s, long long n, unsigned long long seed) {
    ds41_err err;
    if (ds41_seq_synthetic(&s->seq, n, seed, &err)) {
        snprintf(s->err, sizeof s->err, "%s", err.msg);
        return -1;
    }
    return 0;
}

/* ds41_feed, and ds41_feed_logits when rows != NULL (rows [n, vocab]); ahead > 0
 * (ds41_feed_part): the prompt goes on for ahead more tokens after these; img != NULL
 * (ds41_feed_embeds): the rows with img[i] are image positions embedded as emb[i * dim ..]. */
static int feed_rows(ds41_session *s, const int32_t *ids, size_t n, float *rows, size_t ahead, const float *emb,
                     const uint8_t *img) {
    if (s->broken) { snprintf(s->err, sizeof s->err, "session is unusable after an earlier error; reset it"); return -1; }
    if (n == 0) { snprintf(s->err, sizeof s->err, "feed: no tokens"); return -1; }
    s->spec.pending = -1;   /* speculative: a fed token replaces the pending one */
    long long P = s->seq.cache.pos;
    if ((long long)n > s->seq.cache.max_pos - P) {
        snprintf(s->err, sizeof s->err, "feed: %zu tokens at position %lld exceed the context size %lld", n, P,
                 s->seq.cache.max_pos);
        return -1;
    }
    int V = s->e->cfg->vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            snprintf(s->err, sizeof s->err, "token id %d (index %zu) is outside the vocabulary 0..%d", ids[i], i, V - 1);
            return -1;
        }
    size_t chunk = s->p.chunk > 0 ? (size_t)s->p.chunk : n, k = 0, unit = 1;
    if (s->p.chunk == 0 && n > DS41_CHUNK_AUTO) {
        /* the default for long feeds: k about equal chunks of at most DS41_CHUNK_AUTO (each
         * then over half of it: at least the window, never a lone last row), their bounds at
         * positions that are multiples of every compress ratio, so that no chunk but the
         * last leaves rows of an incomplete group in a compressor's state (one forward would
         * not have written those slots) */
        size_t most = DS41_CHUNK_AUTO, W = (size_t)s->e->cfg->window;
        if (most < 2 * W) most = 2 * W;
        k = (n + most - 1) / most;
        for (int i = 0; i < s->seq.cache.n_stores; i++) {
            size_t r = (size_t)s->seq.cache.stores[i].ratio, a = unit, b = r;
            while (b) { size_t t = a % b; a = b; b = t; }
            if (r > 0) unit = unit / a * r;   /* lcm */
        }
        if (unit > most / 4) unit = 1;   /* (no such plan: ratios are at most a page) */
    }
    ds41_err err;
    for (size_t off = 0, i = 1; off < n; off += chunk, i++) {
        if (k > 0) {
            /* bound i of k: position P + i n / k rounded up to the unit (the last: n) */
            size_t end = i >= k ? n : (((size_t)P + i * n / k + unit - 1) / unit * unit - (size_t)P);
            if (end > n) end = n;
            chunk = end - off;
        }
        size_t m = n - off < chunk ? n - off : chunk;
        int last = off + m == n && ahead == 0;
        /* the replay approximation only makes sense on the final rows of a prompt; earlier
         * chunks use the exact CED row plan */
        s->seq.prefill = (ds41_prefill_mode)s->p.prefill;
        if (!last && s->seq.prefill == DS41_PREFILL_REPLAY) s->seq.prefill = DS41_PREFILL_CED;
        /* a chunk's CED row plan reaches from the prompt's end (the rest follows in this call) */
        s->seq.plan_ahead = rows ? 0 : (long long)(n - off - m + ahead);
        s->seq.ov_img = img ? img + off : NULL;
        s->seq.ov_emb = img ? emb + off * (size_t)s->e->cfg->dim : NULL;
        int frc = rows ? ds41_forward_rows(&s->seq, ids + off, (int)m, rows + off * (size_t)V, &err)
                       : ds41_forward(&s->seq, ids + off, (int)m, last, &err);
        s->seq.plan_ahead = 0;
        s->seq.ov_img = NULL;
        s->seq.ov_emb = NULL;
        if (frc || seed_rows(s, &err)) {
            snprintf(s->err, sizeof s->err, "%s", err.msg);
            s->broken = 1;
            return -1;
        }
    }
    return 0;
}

static int feed_impl(ds41_session *s, const int32_t *ids, size_t n, float *rows, size_t ahead) {
    return feed_rows(s, ids, n, rows, ahead, NULL, NULL);
}

int ds41_feed(ds41_session *s, const int32_t *ids, size_t n) { return feed_impl(s, ids, n, NULL, 0); }

/* A feed's image rows: 0 when there is none (text), 1 when they can be fed, -1 refused (s->err). */
static int image_rows(ds41_session *s, size_t n, const float *emb, const uint8_t *is_image) {
    int any = 0;
    for (size_t i = 0; is_image && i < n; i++) any |= is_image[i] != 0;
    if (!any) return 0;
    if (!emb) { snprintf(s->err, sizeof s->err, "feed: image positions without embeddings"); return -1; }
    if (!s->e->w->layers[0].gate_bias_vl) {
        snprintf(s->err, sizeof s->err, "feed: image positions need gate.bias_vl (the config has no vision tower)");
        return -1;
    }
    if (s->p.prefill == DS41_PREFILL_MODE_REPLAY) {
        snprintf(s->err, sizeof s->err, "feed: image positions with the ced-replay prefill (use ced or full)");
        return -1;
    }
    return 1;
}

int ds41_feed_embeds(ds41_session *s, const int32_t *ids, size_t n, const float *emb, const uint8_t *is_image) {
    int im = image_rows(s, n, emb, is_image);
    if (im < 0) return -1;
    return im ? feed_rows(s, ids, n, NULL, 0, emb, is_image) : feed_impl(s, ids, n, NULL, 0);
}

/* ds41_feed_part, with image rows as ds41_feed_embeds takes them (is_image NULL: text) */
static int feed_part_embeds(ds41_session *s, const int32_t *ids, size_t n, size_t ahead, const float *emb,
                            const uint8_t *is_image) {
    long long room = s->seq.cache.max_pos - s->seq.cache.pos;
    if (n <= (size_t)room && ahead > (size_t)room - n) {
        /* refused up front, like a feed past the context: nothing changes */
        snprintf(s->err, sizeof s->err, "feed: %zu tokens and %zu more of the prompt at position %lld exceed the context size %lld",
                 n, ahead, s->seq.cache.pos, s->seq.cache.max_pos);
        return -1;
    }
    int im = image_rows(s, n, emb, is_image);
    if (im < 0) return -1;
    return feed_rows(s, ids, n, NULL, ahead, im ? emb : NULL, im ? is_image : NULL);
}

int ds41_feed_part(ds41_session *s, const int32_t *ids, size_t n, size_t ahead) {
    return feed_part_embeds(s, ids, n, ahead, NULL, NULL);
}

/* ---- prefix-cache restore (restore.h) ---- */
ds41_seq *ds41_session_seq(ds41_session *s) { return &s->seq; }

void ds41_session_absorb(ds41_session *s, size_t n, const float *logits, const char *err) {
    if (err) {
        snprintf(s->err, sizeof s->err, "%s", err);
        s->broken = 1;
        return;
    }
    s->seq.cache.pos += (long long)n;
    if (logits) memcpy(s->seq.logits, logits, (size_t)s->e->cfg->vocab_size * sizeof(float));
}

void ds41_session_absorb_token(ds41_session *s, size_t n, int32_t id) {
    s->seq.cache.pos += (long long)n;
    s->next = id;
    s->sampled = 1;
}

static int spec_ready(ds41_session *s);

int ds41_session_absorb_verify(ds41_session *s, int k, int accepted) {
    if (spec_ready(s)) return -1;   /* the state the verify would have set up */
    s->seq.cache.pos += (long long)accepted + 1;
    ds41_spec_observe(&s->spec, k, accepted);
    return 0;
}
int ds41_session_index_k(const ds41_session *s) { return s->p.index_k; }

int ds41_session_restore(ds41_session *s, const int32_t *ids, long long M, uint8_t *const *pages, int mode,
                         int want_logits, const ds41_restore_img *im) {
    if (s->broken) { snprintf(s->err, sizeof s->err, "session is unusable after an earlier error; reset it"); return -1; }
    s->spec.pending = -1;
    ds41_err err;
    s->dpend_n = 0;   /* a restore rebuilds the state: the pending rows belong to the old one */
    if (ds41_seq_restore(&s->seq, ids, M, pages, mode, want_logits, im, &err) || seed_rows(s, &err)) {
        snprintf(s->err, sizeof s->err, "%s", err.msg);
        s->broken = 1;
        return -1;
    }
    return 0;
}

int ds41_session_install(ds41_session *s, const int32_t *ids, long long M, uint8_t *const *pages,
                         const ds41_resume_state *st) {
    if (s->broken) { snprintf(s->err, sizeof s->err, "session is unusable after an earlier error; reset it"); return -1; }
    s->spec.pending = -1;
    ds41_err err;
    s->dpend_n = 0;
    if (ds41_seq_install(&s->seq, ids, M, pages, st, &err) || seed_rows(s, &err)) {
        snprintf(s->err, sizeof s->err, "%s", err.msg);
        s->broken = 1;
        return -1;
    }
    return 0;
}

int ds41_session_drafts(const ds41_session *s) { return s->p.draft != 0; }

/* ---- all-row logits (perplexity, speculative verification) ---- */
int ds41_feed_logits(ds41_session *s, const int32_t *ids, size_t n, float *out) {
    if (!out) { snprintf(s->err, sizeof s->err, "feed_logits: no output buffer"); return -1; }
    return feed_impl(s, ids, n, out, 0);
}

int ds41_feed_batch(ds41_session **ss, const int32_t *const *ids, const size_t *n, int count) {
    ds41_batch_item *it = calloc(count > 0 ? (size_t)count : 1, sizeof *it);
    if (!it) {   /* one at a time */
        int failed = 0;
        for (int i = 0; i < count; i++) failed += ds41_feed(ss[i], ids[i], n[i]) != 0;
        return failed;
    }
    for (int i = 0; i < count; i++) { it[i].s = ss[i]; it[i].ids = ids[i]; it[i].n = n[i]; }
    int failed = ds41_batch_step(it, count);
    free(it);
    return failed;
}

const float *ds41_logits(const ds41_session *s) {
    /* --split layers: the last stage sends them now (every rank asks at the same point) */
    if (s->seq.lg_unshared) {
        ds41_pipe_fetch(s->e->pipe, s->seq.logits, (size_t)s->e->cfg->vocab_size);
        ((ds41_session *)s)->seq.lg_unshared = 0;   /* the session's own state, not the caller's view */
    }
    return s->seq.logits;
}

void ds41_logits_reduce(ds41_session *s, void (*fn)(const float *row, int V, void *arg, void *out), void *arg, void *out,
                        size_t n) {
    int V = s->e->cfg->vocab_size;
    if (!s->seq.lg_unshared) { fn(ds41_logits(s), V, arg, out); return; }
    /* --split layers: the row is the last stage's; its reduction to rank 0 */
    memset(out, 0, n);
    if (ds41_pipe_last(s->e->pipe)) fn(s->seq.logits, V, arg, out);
    ds41_pipe_reduced(s->e->pipe, out, n);
}

void ds41_session_set_sampling(ds41_session *s, float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
    struct ds41_lproc *lp = s->sampler0.lp;
    ds41_sampler_init(&s->sampler0, temperature, top_k, top_p, min_p, seed);
    s->sampler0.lp = lp;
    s->sampler = s->sampler0;
}

int ds41_session_set_lproc(ds41_session *s, struct ds41_lproc *lp) {
    if (lp && !s->prow) {
        s->prow = malloc((size_t)s->e->cfg->vocab_size * sizeof(float));
        if (!s->prow) return -1;
    }
    s->sampler0.lp = lp;
    s->sampler.lp = lp;
    return 0;
}

/* The one place a plain step's row is processed: a copy, so ds41_logits stays the model's. */
static int session_sample_here(ds41_session *s) {
    int V = s->e->cfg->vocab_size;
    const float *row = s->seq.logits;
    const ds41_ctx *ctx = &s->e->ctx;
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_SAMPLE, 0);
    if (ds41_lproc_active(s->sampler.lp)) {
        memcpy(s->prow, row, (size_t)V * sizeof(float));
        ds41_lproc_apply(s->sampler.lp, s->prow, NULL, 0);
        row = s->prow;
    }
    int id = ds41_sample(&s->sampler, row, V, s->sscratch, s->iscratch);
    if (ctx->bd) ds41_bd_leave(ctx);
    return id;
}

int ds41_session_sample(ds41_session *s) {
    if (s->sampled) {   /* drawn by the rank that ran the forward (ds41_session_absorb_token) */
        s->sampled = 0;
        return s->next;
    }
    ds41_pipe *p = s->e->pipe;
    if (!p || !ds41_pipe_ids(p)) return session_sample_here(s);
    /* --split layers: the last stage samples and sends the token; the other ranks take it */
    int id = ds41_pipe_last(p) ? session_sample_here(s) : 0;
    ds41_pipe_token(p, &id);
    return id;
}

int ds41_draft_block_size(const ds41_engine *e) {
    return e->cfg->n_mtp > 0 && e->cfg->dspark_block_size > 0 ? e->cfg->dspark_block_size : 0;
}

/* The checks of a proposal after t_next at the session's last position; the work buffer
 * allocated on first use. Returns the main_hidden row of P, or NULL (s->err set). */
static const float *draft_prepare(ds41_session *s, int32_t t_next) {
    ds41_seq *q = &s->seq;
    long long P = q->cache.pos - 1;
    /* a failed feed may have written part of the state (rings, KV pages) */
    if (s->broken) { snprintf(s->err, sizeof s->err, "session is unusable after an earlier error; reset it"); return NULL; }
    if (!s->p.draft) { snprintf(s->err, sizeof s->err, "draft: the session was opened without params.draft"); return NULL; }
    if (P < 1 || !q->main_hidden || q->mh_rows < 1 || q->mh_pos0 + q->mh_rows - 1 != P) {
        snprintf(s->err, sizeof s->err, "draft: needs a forward that ended at a position >= 1");
        return NULL;
    }
    if (t_next < 0 || t_next >= s->e->cfg->vocab_size) {
        snprintf(s->err, sizeof s->err, "draft: token %d outside the vocabulary", t_next);
        return NULL;
    }
    if (!s->dwork) {
        ds41_err err;
        if (!(s->dwork = ds41_dspark_work_new(s->e, &err))) { snprintf(s->err, sizeof s->err, "%s", err.msg); return NULL; }
    }
    if (seed_settle(s)) return NULL;   /* the proposal reads the rings */
    return q->main_hidden + (size_t)(q->mh_rows - 1) * s->e->cfg->n_dspark_targets * s->e->cfg->dim;
}

int ds41_session_draft(ds41_session *s, int32_t t_next, int32_t *ids, float *conf) {
    const float *row = draft_prepare(s, t_next);
    if (!row) return -1;
    ds41_err err;
    if (ds41_dspark_propose_w(s->e, &s->seq.cache, s->dwork, row, s->seq.cache.pos - 1, t_next, NULL,
                              !s->p.no_meta_reuse, ids, conf, &err)) {
        snprintf(s->err, sizeof s->err, "%s", err.msg);
        return -1;
    }
    int B = ds41_draft_block_size(s->e);
    if (s->t_dspark_i) fwrite(ids, sizeof(int32_t), (size_t)B, s->t_dspark_i);
    if (s->t_dspark_f) fwrite(conf, sizeof(float), (size_t)B, s->t_dspark_f);
    return 0;
}

int ds41_session_draft_all(int n, ds41_session *const *s, const int32_t *t_next, int ndraft, int32_t *const *ids,
                           float *const *conf, int *rc) {
    if (n <= 0) return 0;
    const ds41_engine *e = s[0]->e;
    int nf = 0, m = 0;
    ds41_cache **c = malloc((size_t)n * sizeof *c);
    const float **row = malloc((size_t)n * sizeof *row);
    long long *P = malloc((size_t)n * sizeof *P);
    int32_t *tn = malloc((size_t)n * sizeof *tn);
    int *reuse = malloc((size_t)n * sizeof *reuse), *at = malloc((size_t)n * sizeof *at);
    int32_t **bi = malloc((size_t)n * sizeof *bi);
    float **bc = malloc((size_t)n * sizeof *bc);
    if (!c || !row || !P || !tn || !reuse || !at || !bi || !bc) {
        for (int i = 0; i < n; i++) {
            snprintf(s[i]->err, sizeof s[i]->err, "draft: out of memory for %d proposals", n);
            rc[i] = -1;
        }
        nf = n;
        goto done;
    }
    /* each session's checks (and its deferred ring writes) first; those that pass propose together */
    for (int i = 0; i < n; i++) {
        rc[i] = -1;
        if (s[i]->e != e) {
            snprintf(s[i]->err, sizeof s[i]->err, "draft: the sessions of one batch of proposals must share an engine");
            nf++;
            continue;
        }
        const float *r = draft_prepare(s[i], t_next[i]);
        if (!r) { nf++; continue; }
        c[m] = &s[i]->seq.cache;
        row[m] = r;
        P[m] = s[i]->seq.cache.pos - 1;
        tn[m] = t_next[i];
        reuse[m] = !s[i]->p.no_meta_reuse;
        bi[m] = ids[i];
        bc[m] = conf[i];
        at[m++] = i;
    }
    if (m > 0) {
        ds41_err err;
        int brc = ds41_dspark_propose_batch(e, m, c, row, P, tn, reuse, ndraft, bi, bc, &err);
        int B = ds41_draft_block_size(e);
        for (int j = 0; j < m; j++) {
            ds41_session *q = s[at[j]];
            if (brc) {
                snprintf(q->err, sizeof q->err, "%s", err.msg);
                nf++;
                continue;
            }
            rc[at[j]] = 0;
            if (q->t_dspark_i) fwrite(ids[at[j]], sizeof(int32_t), (size_t)B, q->t_dspark_i);
            if (q->t_dspark_f) fwrite(conf[at[j]], sizeof(float), (size_t)B, q->t_dspark_f);
        }
    }
done:
    free(c); free(row); free(P); free(tn); free(reuse); free(at); free(bi); free(bc);
    return nf;
}

void ds41_session_state(const ds41_session *s, ds41_state_info *o) {
    ds41_state_bytes b;
    ds41_cache_bytes(&s->seq.cache, &b);
    memset(o, 0, sizeof *o);
    o->tokens = s->seq.cache.pos;
    o->global_kv_bytes = b.global_kv_written;
    o->global_kv_main_bytes = b.global_kv_main;
    o->global_kv_index_bytes = b.global_kv_index;
    o->global_kv_page_bytes = b.global_kv_pages;
    o->swa_bytes = b.swa_rings;
    o->dspark_ring_bytes = b.dspark_rings;
    o->compressor_bytes = b.compressor;
    o->engram_bytes = b.engram_history;
    o->total_bytes = b.total_held;
    o->global_kv_bytes_per_token = b.global_kv_per_token;
}

/* ====================================================================== trace */

static FILE *trace_open(ds41_session *s, const char *fmt, int l) {
    char name[64], *path;
    snprintf(name, sizeof name, fmt, l);
    path = ds41_path_join(s->trace_dir, name);
    if (!path) return NULL;
    FILE *f = fopen(path, "wb");
    free(path);
    return f;
}

int ds41_session_trace(ds41_session *s, const char *dir) {
    /* a second call ends the first trace (its files would otherwise stay open and leak) */
    if (s->trace_dir && ds41_session_trace_finish(s)) {
        snprintf(s->err, sizeof s->err, "cannot finish the earlier trace before starting one in %s", dir);
        return -1;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(s->err, sizeof s->err, "%s: cannot create the trace directory: %s", dir, strerror(errno));
        return -1;
    }
    s->trace_dir = strdup(dir);
    const ds41_config *cfg = s->e->cfg;
    int L = cfg->n_layers;
    s->trace.topk = calloc((size_t)L, sizeof(FILE *));
    s->trace.experts = calloc((size_t)L, sizeof(FILE *));
    if (!s->trace_dir || !s->trace.topk || !s->trace.experts) { snprintf(s->err, sizeof s->err, "out of memory"); return -1; }
    /* --split layers: each stage writes the files of what it holds, the first the tokens, the
     * last the logits and the proposals, so that no file has two writers and the stages' files
     * in one directory are one process's trace (docs/distributed.md) */
    const ds41_pipe *pp = s->e->pipe;
    int first = !pp || ds41_pipe_first(pp), last = !pp || ds41_pipe_last(pp);
    int bad = 0;
    if (first) bad |= !(s->t_tokens = trace_open(s, "tokens.i32", 0));
    if (last) bad |= !(s->t_logits = trace_open(s, "logits.f32", 0));
    if (s->p.draft && last) {
        bad |= !(s->t_dspark_i = trace_open(s, "dspark.i32", 0));
        bad |= !(s->t_dspark_f = trace_open(s, "dspark.f32", 0));
    }
    for (int l = 0; l < L; l++) {
        if (pp && !ds41_pipe_holds(pp, l)) continue;
        if (cfg->layers[l].is_index_source) bad |= !(s->trace.topk[l] = trace_open(s, "topk_L%d.i32", l));
        bad |= !(s->trace.experts[l] = trace_open(s, "experts_L%d.i32", l));
    }
    if (bad) { snprintf(s->err, sizeof s->err, "%s: cannot create the trace files", dir); return -1; }
    s->seq.trace = &s->trace;
    return 0;
}

void ds41_session_trace_tokens(ds41_session *s, const int32_t *ids, size_t n) {
    if (s->t_tokens) fwrite(ids, sizeof(int32_t), n, s->t_tokens);
}

void ds41_session_trace_logits(ds41_session *s) {
    if (s->t_logits) fwrite(s->seq.logits, sizeof(float), (size_t)s->e->cfg->vocab_size, s->t_logits);
}

int ds41_session_trace_finish(ds41_session *s) {
    if (!s->trace_dir) return 0;
    const ds41_config *cfg = s->e->cfg;
    ds41_cache *c = &s->seq.cache;
    int bad = 0;
    const ds41_pipe *pp = s->e->pipe;   /* --split layers: this stage's layers only */
    for (int i = 0; i < c->n_stores; i++) {
        ds41_kv_store *st = &c->stores[i];
        if (!ds41_store_here(s->e, i)) continue;
        FILE *fk = trace_open(s, "kv_L%d.bin", st->layer), *fi = trace_open(s, "ik_L%d.bin", st->layer);
        if (!fk || !fi) bad = 1;
        for (long long j = 0; j < st->n_entries && fk && fi; j++) {
            fwrite(ds41_store_kv_rec(st, j, 0, NULL), 1, (size_t)st->kv_bytes, fk);
            fwrite(ds41_store_ik_rec(st, j, 0, NULL), 1, (size_t)st->ik_bytes, fi);
        }
        if (fk) fclose(fk);
        if (fi) fclose(fi);
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        if (pp && !ds41_pipe_holds(pp, l)) continue;
        FILE *f = trace_open(s, "swa_L%d.bin", l);
        if (!f) { bad = 1; continue; }
        fwrite(c->rings[l].rec, 1, (size_t)c->rings[l].slots * c->rings[l].rec_bytes, f);
        fclose(f);
    }
    for (int i = 0; i < c->n_comp; i++) {
        if (pp && !ds41_pipe_holds(pp, c->comp[i].layer)) continue;
        FILE *f = trace_open(s, "comp_L%d.f32", c->comp[i].layer);
        if (!f) { bad = 1; continue; }
        fwrite(c->comp[i].kv, sizeof(float), (size_t)c->comp[i].ratio * c->comp[i].dim, f);
        fwrite(c->comp[i].sc, sizeof(float), (size_t)c->comp[i].ratio * c->comp[i].dim, f);
        fclose(f);
    }
    FILE **fs[] = { &s->t_tokens, &s->t_logits, &s->t_dspark_i, &s->t_dspark_f };
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        if (*fs[i] && fclose(*fs[i]) != 0) bad = 1;
        *fs[i] = NULL;
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        if (s->trace.topk && s->trace.topk[l]) fclose(s->trace.topk[l]);
        if (s->trace.experts && s->trace.experts[l]) fclose(s->trace.experts[l]);
    }
    free(s->trace.topk);
    free(s->trace.experts);
    s->trace.topk = s->trace.experts = NULL;
    s->seq.trace = NULL;
    free(s->trace_dir);
    s->trace_dir = NULL;
    return bad ? -1 : 0;
}

/* ====================================================================== speculative decoding */

static int spec_ready(ds41_session *s) {
    if (s->spec_ready) return 0;
    ds41_err err;
    int32_t pend = s->spec.pending;
    if (ds41_spec_state_init(&s->spec, s->e, &err)) { snprintf(s->err, sizeof s->err, "%s", err.msg); return -1; }
    s->spec.pending = pend;
    s->spec_ready = 1;
    return 0;
}

int32_t ds41_spec_pending(const ds41_session *s) { return s->spec.pending; }

int ds41_spec_verify(ds41_session *s, int32_t t_next, const int32_t *drafts, int k, int32_t *out, float *out_logits,
                     int *n_accepted) {
    if (s->broken) { snprintf(s->err, sizeof s->err, "session is unusable after an earlier error; reset it"); return -1; }
    if (spec_ready(s)) return -1;
    if (k < 0 || k + 1 > s->spec.cap) { snprintf(s->err, sizeof s->err, "verify: %d drafts, at most %d", k, s->spec.cap - 1); return -1; }
    if (seed_settle(s)) return -1;   /* the verify snapshots and seeds the rings */
    ds41_err err;
    long long pos = s->seq.cache.pos;
    int acc = 0;
    int n = ds41_spec_verify_block(s->e, &s->seq, &s->sampler, s->p.draft, &s->spec, t_next, drafts, k, out, out_logits,
                                   &acc, &err);
    if (n_accepted) *n_accepted = acc;
    if (n > 0) ds41_spec_observe(&s->spec, k, acc);
    if (n < 0) {
        snprintf(s->err, sizeof s->err, "%s", err.msg);
        s->seq.verify = 0;
        /* refused before the forward ("verify: ..."): nothing changed; a failure inside it
         * may have written part of the state, so the session breaks as with ds41_feed */
        if (strncmp(err.msg, "verify:", 7) != 0 || s->seq.cache.pos != pos) s->broken = 1;
    }
    return n;
}

int ds41_spec_max_drafts(const ds41_session *s) {
    if (s->broken || !s->p.draft) return 0;
    long long P = s->seq.cache.pos, k = ds41_draft_block_size(s->e);
    if (P < 2) return 0;
    if (k > s->seq.cache.max_pos - P - 1) k = s->seq.cache.max_pos - P - 1;
    long long cap = s->spec_ready ? s->spec.cap - 1 : (k < s->e->cfg->window - 1 ? k : s->e->cfg->window - 1);
    if (k > cap) k = cap;
    if (s->p.index_k == DS41_INDEX_K_OFFICIAL && k > P - 1) k = P - 1;
    return k > 0 ? (int)k : 0;
}

/* An item the batched forward can take, of a session that has no trace open and is not
 * broken: a decode row (n = 1) or a verify block after a prompt, or (chunk: one per step) a
 * prefill chunk that ds41_feed would run as one forward with the session's CED / full row plan
 * (not the replay approximation, not split by the session's --chunk). Anything else (further
 * chunks, traced sessions, errors to report) goes through ds41_feed / ds41_spec_verify. */
static int batchable(const ds41_batch_item *b, int chunk) {
    const ds41_session *s = b->s;
    if (s->broken || s->trace_dir || b->n < 1) return 0;
    if (chunk) {
        /* one forward in ds41_feed_part too: within the session's chunk setting */
        size_t most = s->p.chunk > 0 ? (size_t)s->p.chunk : s->p.chunk == 0 ? (size_t)DS41_CHUNK_AUTO : b->n;
        long long room = s->seq.cache.max_pos - s->seq.cache.pos;
        return !b->verify && b->n > 1 && b->n <= most && s->p.prefill != DS41_PREFILL_REPLAY &&
               (long long)(b->n + b->ahead) <= room;
    }
    if (s->seq.cache.pos < 1) return 0;
    return b->verify || b->n == 1;
}

int ds41_spec_want_draft(ds41_session *s, const ds41_spec_curve *curve) {
    int km = ds41_spec_max_drafts(s);
    if (km <= 0) return 0;
    if (spec_ready(s)) return 1;
    return ds41_spec_gate(&s->spec, curve, km);
}

double ds41_spec_acceptance(const ds41_session *s, int j) {
    if (j < 0 || j >= DS41_SPEC_MAX_DRAFTS) return -1.0;
    return ds41_spec_survival(&s->spec, j);
}

int ds41_batch_step(ds41_batch_item *it, int count) {
    int failed = 0;
    if (count < 1) return 0;
    ds41_seq **ss = calloc((size_t)count, sizeof *ss);
    const int32_t **tok = calloc((size_t)count, sizeof *tok);
    int *T = calloc((size_t)count, sizeof *T), *idx = calloc((size_t)count, sizeof *idx);
    float **rows = calloc((size_t)count, sizeof *rows);
    int32_t (*blocks)[DS41_SPEC_MAX_DRAFTS + 1] = calloc((size_t)count, sizeof *blocks);
    int nb = 0, ok = ss && tok && T && idx && rows && blocks;
    /* a session listed twice: every item one at a time, in order */
    for (int i = 0; i < count && ok; i++)
        for (int j = 0; j < i && ok; j++)
            if (it[j].s == it[i].s) ok = 0;
    /* the first prefill chunk the forward can take goes first in the stack (ds41_forward_batch
     * runs its row plan on rows that start the stack) */
    int ci = -1;
    for (int i = 0; i < count && ok && ci < 0; i++)
        if (batchable(&it[i], 1)) ci = i;
    /* serve --split layers, a pipelined step: the logits reach rank 0 at the step's end, so
     * the verify blocks' acceptance and rollback wait for it (ds41_batch_end) */
    int later = 0;
    for (int i = 0; i < count && !later; i++) later = it[i].s && ds41_pipe_deferred(it[i].s->e->pipe);
    for (int oi = 0; oi < count; oi++) {
        int i = ci < 0 || oi > ci ? oi : oi == 0 ? ci : oi - 1;
        ds41_batch_item *b = &it[i];
        b->n_out = b->n_accepted = 0;
        b->failed = 0;
        b->s->vend = 0;
        if (ok && batchable(b, i == ci)) {
            /* the checks and preparation of ds41_feed / ds41_spec_verify, without the forward */
            ds41_session *s = b->s;
            ds41_err err;
            if (b->verify) {
                long long pos = s->seq.cache.pos;
                if (spec_ready(s) || seed_settle(s)) { b->failed = 1; continue; }
                int k = (int)b->n - 1;
                if (k + 1 > s->spec.cap) {
                    snprintf(s->err, sizeof s->err, "verify: %d drafts, at most %d", k, s->spec.cap - 1);
                    b->failed = 1;
                    continue;
                }
                if (ds41_spec_verify_begin(s->e, &s->seq, &s->spec, b->ids[0], b->ids + 1, k, blocks[nb], &err) < 0) {
                    snprintf(s->err, sizeof s->err, "%s", err.msg);
                    s->seq.verify = 0;
                    if (strncmp(err.msg, "verify:", 7) != 0 || s->seq.cache.pos != pos) s->broken = 1;
                    b->failed = 1;
                    continue;
                }
                tok[nb] = blocks[nb];
                rows[nb] = s->spec.rows;
            } else {
                int bad = s->seq.cache.pos + (long long)b->n > s->seq.cache.max_pos;
                for (size_t t = 0; t < b->n && !bad; t++) bad = b->ids[t] < 0 || b->ids[t] >= s->e->cfg->vocab_size;
                if (bad) {
                    b->failed = ds41_feed(s, b->ids, b->n) != 0;   /* reports the error */
                    continue;
                }
                int im = image_rows(s, b->n, b->emb, b->is_image);
                if (im < 0) { b->failed = 1; continue; }
                /* the forward reads them and clears them (ds41_feed_embeds' override) */
                s->seq.ov_img = im ? b->is_image : NULL;
                s->seq.ov_emb = im ? b->emb : NULL;
                s->spec.pending = -1;
                s->seq.prefill = (ds41_prefill_mode)s->p.prefill;
                /* a prompt part plans its CED rows against the prompt's end (ds41_feed_part) */
                s->seq.plan_ahead = b->n > 1 ? (long long)b->ahead : 0;
                tok[nb] = b->ids;
                rows[nb] = NULL;
            }
            ss[nb] = &s->seq;
            T[nb] = (int)b->n;
            idx[nb++] = i;
            continue;
        }
        /* one at a time: prefill chunks, traced sessions, errors */
        if (b->verify && later) {
            /* its acceptance would read logits that have not come (a broken session says so) */
            if (!b->s->broken)
                snprintf(b->s->err, sizeof b->s->err, "verify: a block the batched forward cannot take, in a pipelined "
                         "step (--split layers; not supported)");
            b->failed = 1;
        } else if (b->verify) {
            int m = b->n >= 1 ? ds41_spec_verify(b->s, b->ids[0], b->ids + 1, (int)b->n - 1, b->out, b->out_logits,
                                                 &b->n_accepted)
                              : -1;
            if (b->n < 1) snprintf(b->s->err, sizeof b->s->err, "batch: a verify item needs t_next");
            b->failed = m < 0;
            if (m > 0) b->n_out = m;
        } else {
            b->failed = feed_part_embeds(b->s, b->ids, b->n, b->ahead, b->emb, b->is_image) != 0;
        }
    }
    if (nb > 0) {
        ds41_err err;
        int frc = ds41_forward_batch(ss, tok, T, rows, nb, &err);
        for (int j = 0; j < nb; j++) ss[j]->plan_ahead = 0, ss[j]->ov_img = NULL, ss[j]->ov_emb = NULL;
        if (frc) {
            for (int j = 0; j < nb; j++) {
                ds41_session *s = it[idx[j]].s;
                snprintf(s->err, sizeof s->err, "%s", err.msg);
                s->seq.verify = 0;
                s->broken = 1;
                it[idx[j]].failed = 1;
            }
        } else {
            for (int j = 0; j < nb; j++) {
                ds41_batch_item *b = &it[idx[j]];
                ds41_session *s = b->s;
                int rc;
                if (b->verify && later) {
                    s->seq.verify = 0;
                    memcpy(s->vend_blk, blocks[j], b->n * sizeof *blocks[j]);
                    s->vend = 1;
                    continue;
                }
                if (b->verify) {
                    rc = ds41_spec_verify_end(s->e, &s->seq, &s->sampler, s->p.draft, &s->spec, blocks[j], (int)b->n - 1,
                                              b->out, b->out_logits, &b->n_accepted, &err);
                    if (rc > 0) {
                        b->n_out = rc;
                        /* the drafting gate's acceptance counts, as ds41_spec_verify records them */
                        ds41_spec_observe(&s->spec, (int)b->n - 1, b->n_accepted);
                    }
                } else {
                    rc = seed_rows(s, &err);
                }
                if (rc < 0) {
                    snprintf(s->err, sizeof s->err, "%s", err.msg);
                    s->broken = 1;
                    b->failed = 1;
                }
            }
        }
    }
    for (int i = 0; i < count; i++) failed += it[i].failed;
    free(ss); free(tok); free(T); free(idx); free(rows); free(blocks);
    return failed;
}

int ds41_batch_end(ds41_batch_item *it, int count, int32_t *outcome, int take) {
    int failed = 0;
    for (int i = 0, v = 0; i < count; i++) {
        ds41_batch_item *b = &it[i];
        if (!b->verify) continue;
        int32_t *o = outcome + 2 * v++;
        ds41_session *s = b->s;
        if (!s || !s->vend) {
            if (!take) o[0] = o[1] = -1;
            continue;
        }
        s->vend = 0;
        ds41_err err;
        int k = (int)b->n - 1;
        int rc;
        if (take && o[0] < 0) {
            rc = ds41_errf(&err, "verify: the deciding rank has no outcome for this block (the ranks' steps differ)");
        } else {
            rc = ds41_spec_verify_end_as(s->e, &s->seq, &s->sampler, s->p.draft, &s->spec, s->vend_blk, k, b->out,
                                         b->out_logits, &b->n_accepted, &err, take ? o : NULL, take ? NULL : o);
        }
        if (rc > 0) {
            b->n_out = rc;
            ds41_spec_observe(&s->spec, k, b->n_accepted);   /* the drafting gate's counts */
        } else {
            if (!take) o[0] = o[1] = -1;
            snprintf(s->err, sizeof s->err, "%s", err.msg);
            s->broken = 1;
            b->failed = 1;
            failed++;
        }
    }
    return failed;
}

int ds41_spec_step(ds41_session *s, const ds41_spec_params *p, int32_t *out, int max_out, float *out_logits,
                   ds41_spec_step_info *info, ds41_spec_stats *st) {
    ds41_spec_params def = { DS41_SPEC_AUTO, 0, NULL };
    if (!p) p = &def;
    if (s->broken) { snprintf(s->err, sizeof s->err, "session is unusable after an earlier error; reset it"); return -1; }
    if (spec_ready(s)) return -1;
    const ds41_config *cfg = s->e->cfg;
    int V = cfg->vocab_size, B = ds41_draft_block_size(s->e);
    if (max_out < B + 2) { snprintf(s->err, sizeof s->err, "spec step: max_out %d < block size + 2 = %d", max_out, B + 2); return -1; }
    long long P = s->seq.cache.pos;
    if (P < 1) { snprintf(s->err, sizeof s->err, "spec step: feed a prompt first"); return -1; }
    if (P + 1 > s->seq.cache.max_pos) { snprintf(s->err, sizeof s->err, "spec step: the context is full"); return -1; }
    ds41_spec_step_info lin;
    if (!info) info = &lin;
    memset(info, 0, sizeof *info);
    int n = 0;
    int32_t t_next = s->spec.pending;
    if (t_next < 0) {
        t_next = ds41_session_sample(s);
        if (out_logits) memcpy(out_logits, ds41_logits(s), (size_t)V * sizeof(float));
        out[n++] = t_next;
    }
    /* how many drafts the step may verify */
    long long kmax = p->mode == DS41_SPEC_OFF ? 0 : B;
    if (kmax > s->seq.cache.max_pos - P - 1) kmax = s->seq.cache.max_pos - P - 1;
    if (kmax > s->spec.cap - 1) kmax = s->spec.cap - 1;
    if (s->p.index_k == DS41_INDEX_K_OFFICIAL && kmax > P - 1) kmax = P - 1;
    int32_t d[DS41_SPEC_MAX_DRAFTS];
    int K = 0;
    int propose = kmax > 0 && s->p.draft && P >= 2;
    /* --split layers (ids after the last stage): the DSpark stages, the gate and the drafts run
     * on the last stage, which holds every target layer; it sends the step's drafts to every
     * rank (ds41_pipe_spec), which then verify the same block */
    ds41_pipe *pp = s->e->pipe && ds41_pipe_ids(s->e->pipe) ? s->e->pipe : NULL;
    for (int ti = 0; pp && ti < cfg->n_dspark_targets && propose; ti++)
        if (!ds41_pipe_holds_last(pp, cfg->dspark_targets[ti])) {
            snprintf(s->err, sizeof s->err, "spec step: DSpark target layer %d is not on the last stage (its taps would "
                     "have to cross the stages; not supported)", cfg->dspark_targets[ti]);
            return -1;
        }
    int drafter = !pp || ds41_pipe_last(pp);
    /* auto: no proposal when drafting cannot pay (the gate counts the proposal's cost) */
    if (drafter && propose && p->mode == DS41_SPEC_AUTO) propose = ds41_spec_gate(&s->spec, p->curve, (int)kmax);
    if (!drafter) propose = 0;
    if (propose) {
        const float *row = draft_prepare(s, t_next);
        ds41_err err;
        if (!row) return -1;
        if (ds41_dspark_begin(s->e, &s->seq.cache, s->dwork, row, P - 1, t_next, !s->p.no_meta_reuse, &err)) {
            snprintf(s->err, sizeof s->err, "%s", err.msg);
            return -1;
        }
        ds41_dspark_work *w = s->dwork;
        int km = (int)kmax;
        if (km > B) km = B;
        /* drafts are made one at a time, only as many as the step verifies (each costs a
         * head + Markov pass); the confidence of draft j needs only the drafts before it */
        double a = 1.0, tau = 1.0;
        if (p->mode == DS41_SPEC_FIXED) {
            int Kf = p->k < km ? p->k : km;
            if (Kf < 0) Kf = 0;
            for (int j = 0; j < Kf; j++) {
                if (ds41_dspark_conf(s->e, w, j, &info->conf[j]) || ds41_dspark_next(s->e, w, NULL, &d[j])) goto order;
                a /= 1.0 + exp(-(double)info->conf[j]);
                info->expected += a;
            }
            K = Kf;
        } else {
            /* spec 5.4 Algorithm 1 for one sequence: survival decreases along the block, so
             * positions come in order; add draft j while Theta = tau / step time grows */
            const ds41_spec_curve *cv = p->curve;
            double theta = ds41_spec_theta(cv, 1, 1, 1, tau);
            for (int j = 0; j < km; j++) {
                if (ds41_dspark_conf(s->e, w, j, &info->conf[j])) goto order;
                double a2 = a / (1.0 + exp(-(double)info->conf[j]));
                double th2 = ds41_spec_theta(cv, 1, 2 + j, 1, tau + a2);
                if (!(th2 > theta)) break;
                if (ds41_dspark_next(s->e, w, NULL, &d[j])) goto order;
                a = a2;
                tau += a2;
                theta = th2;
                K = j + 1;
            }
            info->expected = tau - 1.0;
        }
        info->proposed = ds41_dspark_made(w);
        info->proposal = 1;
    }
    if (pp) {   /* the last stage's step for every rank: K, proposal, proposed, expected, B ids, B confidences */
        unsigned char m[24 + 8 * DS41_DSPARK_MAX_BLOCK];
        int32_t h[3] = { K, info->proposal, info->proposed };
        size_t mb = 24 + 8 * (size_t)B;
        memset(m, 0, sizeof m);
        memcpy(m, h, sizeof h);
        memcpy(m + 16, &info->expected, sizeof info->expected);
        memcpy(m + 24, d, (size_t)K * sizeof *d);
        memcpy(m + 24 + 4 * (size_t)B, info->conf, (size_t)info->proposed * sizeof *info->conf);
        ds41_pipe_spec(pp, m, mb, 2, "the step's drafts, from the last stage");
        memcpy(h, m, sizeof h);
        if (h[0] < 0 || h[0] > kmax || h[0] > B || h[2] < 0 || h[2] > B) {
            snprintf(s->err, sizeof s->err, "spec step: the last stage's %d drafts (%d proposed) are out of range", h[0], h[2]);
            return -1;
        }
        K = h[0], info->proposal = h[1], info->proposed = h[2];
        memcpy(&info->expected, m + 16, sizeof info->expected);
        memcpy(d, m + 24, (size_t)K * sizeof *d);
        memcpy(info->conf, m + 24 + 4 * (size_t)B, (size_t)h[2] * sizeof *info->conf);
    }
    int A = 0, m;
    if (K == 0) {
        /* a plain step: t_next fed as a decode (what a one-row verify computes, without its
         * snapshot and rollback), the next token sampled from its logits and left pending */
        if (feed_impl(s, &t_next, 1, NULL, 0)) return -1;
        int32_t next = ds41_session_sample(s);
        if (out_logits) memcpy(out_logits + (size_t)n * V, ds41_logits(s), (size_t)V * sizeof(float));
        out[n] = next;
        s->spec.pending = next;
        m = 1;
    } else {
        m = ds41_spec_verify(s, t_next, d, K, out + n, out_logits ? out_logits + (size_t)n * V : NULL, &A);
        if (m < 0) return -1;
    }
    n += m;
    info->n_out = n;
    info->drafted = K;
    info->accepted = A;
    if (st) {
        st->steps++;
        st->drafted += K;
        st->accepted += A;
        st->emitted += n;
        for (int i = 0; i < K; i++) st->drafted_at[i]++;
        for (int i = 0; i < A; i++) st->accepted_at[i]++;
    }
    return n;
order:
    snprintf(s->err, sizeof s->err, "spec step: drafts out of order");
    return -1;
}

uint64_t ds41_session_digest(const ds41_session *s) {
    /* the deferred ring writes are part of the state the digest stands for: written first
     * (which changes nothing a later call can observe) */
    if (s->dpend_n > 0) seed_settle((ds41_session *)s);
    const ds41_seq *q = &s->seq;
    const ds41_config *cfg = s->e->cfg;
    uint64_t h = ds41_cache_digest(&q->cache);
    h = ds41_digest_bytes(h, q->logits, (size_t)cfg->vocab_size * sizeof(float));
    if (q->main_hidden && q->mh_rows > 0) {
        size_t w = (size_t)cfg->n_dspark_targets * cfg->dim;
        long long last = q->mh_pos0 + q->mh_rows - 1;
        h = ds41_digest_bytes(h, &last, sizeof last);
        h = ds41_digest_bytes(h, q->main_hidden + (size_t)(q->mh_rows - 1) * w, w * sizeof(float));
    }
    return h;
}
