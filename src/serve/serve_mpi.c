/* ds41 serve under mpiexec: rank 0's record of its engine calls and the followers' replay
 * (serve_mpi.h). */
#include "serve_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "forward.h"
#include "restore.h"
#include "serve_sched.h"
#include "spec.h"

/* how long rank 0 gives the HTTP threads to answer the requests in flight after a fault */
#define FAULT_ANSWER_S 2.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Per rank, with DS41_MPI_VERBOSE=1: the sequences it held and the most state they held at
 * once after a step (all of it, and the global KV pages in it), printed at the end; under
 * --dp-attention rank 0 also counts what its copies of the other ranks' sequences hold (their
 * sessions' rings; no KV pages). */
typedef struct dp_count {
    long long seqs, peak, peak_kv, peak_copies;
} dp_count;

static int verbose(void) {
    static int v = -1;
    if (v < 0) v = getenv("DS41_MPI_VERBOSE") && !strcmp(getenv("DS41_MPI_VERBOSE"), "1");
    return v;
}

static void dp_measure(dp_count *c, ds41_session *const *s, const int *own, int n, int me) {
    if (!verbose()) return;
    long long tot = 0, kv = 0, cp = 0;
    for (int i = 0; i < n; i++) {
        if (!s[i]) continue;
        ds41_state_info si;
        ds41_session_state(s[i], &si);
        if (own && own[i] != me) { cp += si.total_bytes; continue; }
        tot += si.total_bytes;
        kv += si.global_kv_page_bytes;
    }
    if (tot > c->peak) c->peak = tot;
    if (kv > c->peak_kv) c->peak_kv = kv;
    if (cp > c->peak_copies) c->peak_copies = cp;
}

static void dp_report(const dp_count *c) {
    if (!verbose()) return;
    int dp = ds41_dist_dp();
    fprintf(stderr, "ds41 serve [rank %d]: %s: %lld sequences held here, at most %lld bytes of state at once "
                    "(%lld of them global KV pages)", ds41_dist_rank(), dp ? "--dp-attention" : "replicated attention",
            c->seqs, c->peak, c->peak_kv);
    if (dp && ds41_dist_rank() == 0) fprintf(stderr, "; rank 0's copies of the other ranks' sequences: at most %lld bytes", c->peak_copies);
    fprintf(stderr, "\n");
}

/* ---------------------------------------------------------------- rank 0: recorder */

static int share_outcome(int32_t v[2], int k, char *err, size_t errcap);

struct ds41_smirror {
    int32_t *w;
    size_t n, cap;
    const ds41_session **sess;    /* open sessions, their ids and (--dp-attention) the rank that holds each */
    int32_t *sid;
    int *own;
    int n_sess, cap_sess;
    int dp;                       /* --dp-attention */
    int turn;                     /* the rank a tie goes to first */
    int *load;                    /* [ranks]: sessions each rank holds (scratch) */
    long long *held;              /* [ranks]: tokens they hold (scratch) */
    dp_count dpc;
    int32_t next_id;
    double last;                  /* when the last record went out */
};

ds41_smirror *ds41_smirror_new(void) {
    ds41_smirror *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->last = now_s();
    m->dp = ds41_dist_dp();
    if (!m->dp) ds41_spec_set_outcome_hook(share_outcome);
    int N = ds41_dist_size();
    m->load = calloc((size_t)N, sizeof *m->load);
    m->held = calloc((size_t)N, sizeof *m->held);
    if (!m->load || !m->held) {
        ds41_smirror_free(m);
        return NULL;
    }
    return m;
}

void ds41_smirror_free(ds41_smirror *m) {
    if (!m) return;
    ds41_spec_set_outcome_hook(NULL);
    free(m->w);
    free(m->sess);
    free(m->sid);
    free(m->own);
    free(m->load);
    free(m->held);
    free(m);
}

/* out of memory on rank 0 cannot leave the followers behind: the job ends */
static void oom(void) {
    fprintf(stderr, "ds41 serve: out of memory recording the step for the other ranks; ending the job\n");
    fflush(stderr);
    abort();
}

static void put(ds41_smirror *m, const int32_t *v, size_t k) {
    if (m->n + k > m->cap) {
        size_t nc = (m->cap ? m->cap * 2 : 1024) + k;
        int32_t *w = realloc(m->w, nc * sizeof *w);
        if (!w) oom();
        m->w = w;
        m->cap = nc;
    }
    memcpy(m->w + m->n, v, k * sizeof *v);
    m->n += k;
}

static void put1(ds41_smirror *m, int32_t v) { put(m, &v, 1); }

static void flush(ds41_smirror *m) {
    if (m->n > (size_t)INT32_MAX / 4) {
        fprintf(stderr, "ds41 serve: a step of %zu words is too large to send to the other ranks; ending the job\n", m->n);
        abort();
    }
    int32_t len = (int32_t)m->n;
    ds41_dist_bcast(&len, sizeof len);
    if (len) ds41_dist_bcast(m->w, (size_t)len * sizeof *m->w);
    m->n = 0;
    m->last = now_s();
}

static int slot_of(const ds41_smirror *m, const ds41_session *s) {
    for (int i = 0; i < m->n_sess; i++)
        if (m->sess[i] == s) return i;
    fprintf(stderr, "ds41 serve: a session the other ranks do not know was used; ending the job\n");
    abort();
}

static int32_t sid_of(const ds41_smirror *m, const ds41_session *s) { return m->sid[slot_of(m, s)]; }

/* --dp-attention: the rank for a new sequence, the one holding the fewest sequences, then the
 * fewest tokens; among equals the next in turn after the last one chosen (one request at a
 * time then alternates, rather than all going to rank 0, which also runs the HTTP front) */
static int least_loaded(ds41_smirror *m) {
    int N = ds41_dist_size(), best = -1;
    memset(m->load, 0, (size_t)N * sizeof *m->load);
    memset(m->held, 0, (size_t)N * sizeof *m->held);
    for (int i = 0; i < m->n_sess; i++) {
        m->load[m->own[i]]++;
        m->held[m->own[i]] += ds41_session_pos(m->sess[i]);
    }
    for (int j = 0; j < N; j++) {
        int q = (m->turn + j) % N;
        if (best < 0 || m->load[q] < m->load[best] || (m->load[q] == m->load[best] && m->held[q] < m->held[best])) best = q;
    }
    m->turn = (best + 1) % N;
    return best;
}

void ds41_smirror_open(ds41_smirror *m, const ds41_session *s) {
    if (!m) return;
    if (m->n_sess == m->cap_sess) {
        int nc = m->cap_sess ? m->cap_sess * 2 : 16;
        const ds41_session **ns = realloc(m->sess, (size_t)nc * sizeof *ns);
        if (!ns) oom();
        m->sess = ns;
        int32_t *ni = realloc(m->sid, (size_t)nc * sizeof *ni);
        if (!ni) oom();
        m->sid = ni;
        int *no = realloc(m->own, (size_t)nc * sizeof *no);
        if (!no) oom();
        m->own = no;
        m->cap_sess = nc;
    }
    int32_t id = m->next_id;
    m->next_id = (m->next_id + 1) & INT32_MAX;
    int rank = m->dp ? least_loaded(m) : 0;
    m->sess[m->n_sess] = s;
    m->own[m->n_sess] = rank;
    m->sid[m->n_sess++] = id;
    m->dpc.seqs += rank == 0;
    int32_t v[3] = { m->dp ? DS41_SOP_OPEN_ON : DS41_SOP_OPEN, id, rank };
    put(m, v, m->dp ? 3 : 2);
}

void ds41_smirror_close(ds41_smirror *m, const ds41_session *s) {
    if (!m) return;
    int32_t v[2] = { DS41_SOP_CLOSE, sid_of(m, s) };
    put(m, v, 2);
    int i = slot_of(m, s);
    m->sess[i] = m->sess[--m->n_sess];
    m->sid[i] = m->sid[m->n_sess];
    m->own[i] = m->own[m->n_sess];
}

static void put_ids(ds41_smirror *m, int op, const ds41_session *s, const int32_t *ids, size_t n) {
    if (n > (size_t)INT32_MAX) oom();
    int32_t v[3] = { op, sid_of(m, s), (int32_t)n };
    put(m, v, 3);
    put(m, ids, n);
}

void ds41_smirror_restore(ds41_smirror *m, const ds41_session *s, const int32_t *ids, size_t n) {
    if (!m) return;
    put_ids(m, DS41_SOP_RESTORE, s, ids, n);
    flush(m);   /* the restore replays through the forward */
}

void ds41_smirror_publish(ds41_smirror *m, const ds41_session *s, const int32_t *ids, size_t n) {
    if (m) put_ids(m, DS41_SOP_PUBLISH, s, ids, n);
}

void ds41_smirror_trim(ds41_smirror *m, long long bytes) {
    if (!m) return;
    uint64_t b = (uint64_t)(bytes < 0 ? 0 : bytes);
    int32_t v[3] = { DS41_SOP_TRIM, (int32_t)(uint32_t)b, (int32_t)(uint32_t)(b >> 32) };
    put(m, v, 3);
}

void ds41_smirror_step(ds41_smirror *m, const ds41_batch_item *it, int count) {
    if (!m || count < 1) return;
    int32_t v[2] = { DS41_SOP_STEP, count };
    put(m, v, 2);
    for (int i = 0; i < count; i++) {
        int32_t h[3] = { sid_of(m, it[i].s), (int32_t)it[i].n, it[i].verify ? DS41_SOP_VERIFY : (int32_t)it[i].ahead };
        put(m, h, 3);
        put(m, it[i].ids, it[i].n);
    }
    flush(m);
}

void ds41_smirror_draft(ds41_smirror *m, const ds41_session *s, int32_t t_next) {
    if (!m) return;
    int32_t v[3] = { DS41_SOP_DRAFT, sid_of(m, s), t_next };
    put(m, v, 3);
    flush(m);   /* the proposal runs DSpark's MoE layers */
}

void ds41_smirror_calibrate(ds41_smirror *m, int width, int prompt_len, int reps) {
    if (!m) return;
    int32_t v[4] = { DS41_SOP_CALIBRATE, width, prompt_len, reps };
    put(m, v, 4);
    flush(m);
}

void ds41_smirror_embeds(ds41_smirror *m, const ds41_session *s, const int32_t *ids, size_t n, const float *emb,
                         const uint8_t *is_image, int dim) {
    if (!m) return;
    if (n > (size_t)INT32_MAX) oom();
    int32_t v[4] = { DS41_SOP_EMBEDS, sid_of(m, s), (int32_t)n, dim };
    put(m, v, 4);
    put(m, ids, n);
    for (size_t j = 0; j < n; j++) put1(m, is_image && is_image[j] ? 1 : 0);
    for (size_t j = 0; j < n; j++)
        if (is_image && is_image[j]) put(m, (const int32_t *)(const void *)(emb + j * (size_t)dim), (size_t)dim);
    flush(m);   /* the feed is a forward */
}

/* --spec: each verify's outcome {accepted, next token}, from rank 0 to every rank, inside the
 * verify after the forward (ds41_spec_set_outcome_hook); the followers' own acceptance is
 * replaced (serve_mpi.h) */
static int share_outcome(int32_t v[2], int k, char *err, size_t errcap) {
    (void)k;
    if (ds41_dist_bcast(v, 2 * sizeof *v))
        return snprintf(err, errcap, "serve mirror: the verify outcome did not reach every rank"), -1;
    return 0;
}

/* --dp-attention: an item's answer to rank 0, in step order: its error (empty: none), then
 * its logits when the forward computed them (every item but a prompt part that goes on) */
#define ANSWER_ERR 248

static size_t answer_bytes(const ds41_batch_item *b, int V) {
    return ANSWER_ERR + (b->ahead == 0 ? (size_t)V * sizeof(float) : 0);
}

static unsigned char *answer_put(unsigned char *p, const ds41_batch_item *b, int V) {
    const char *err = ds41_session_error(b->s);
    memset(p, 0, ANSWER_ERR);
    if (err && err[0]) snprintf((char *)p, ANSWER_ERR, "%s", err);
    p += ANSWER_ERR;
    if (b->ahead == 0) {
        memcpy(p, ds41_logits(b->s), (size_t)V * sizeof(float));
        p += (size_t)V * sizeof(float);
    }
    return p;
}

static const unsigned char *answer_take(const unsigned char *p, ds41_batch_item *b, int V) {
    char err[ANSWER_ERR];
    memcpy(err, p, ANSWER_ERR);
    err[ANSWER_ERR - 1] = 0;
    p += ANSWER_ERR;
    const float *lg = NULL;
    if (b->ahead == 0) {
        lg = (const float *)p;
        p += (size_t)V * sizeof(float);
    }
    ds41_session_absorb(b->s, b->n, err[0] ? NULL : lg, err[0] ? err : NULL);
    b->failed = err[0] != 0;
    return p;
}

void ds41_smirror_batch_step(ds41_smirror *m, ds41_engine *e, ds41_batch_item *it, int count) {
    if (!m) { ds41_batch_step(it, count); return; }
    ds41_smirror_step(m, it, count);
    if (!m->dp) {
        ds41_batch_step(it, count);
        dp_measure(&m->dpc, (ds41_session *const *)m->sess, NULL, m->n_sess, 0);
        return;
    }
    /* rank 0's own items in one batch, in step order */
    int N = ds41_dist_size(), V = ds41_vocab_size(e), n0 = 0;
    ds41_batch_item *mine = malloc((size_t)count * sizeof *mine);
    size_t *nb = calloc((size_t)N, sizeof *nb);
    unsigned char **buf = calloc((size_t)N, sizeof *buf);
    if (!mine || !nb || !buf) oom();
    for (int i = 0; i < count; i++) {
        int q = m->own[slot_of(m, it[i].s)];
        if (q == 0) mine[n0++] = it[i];
        else nb[q] += answer_bytes(&it[i], V);
    }
    if (n0 > 0) ds41_batch_step(mine, n0);
    ds41_dist_dp_done(&e->ctx);
    for (int q = 1; q < N; q++)
        if (nb[q] && !(buf[q] = malloc(nb[q]))) oom();
    ds41_dist_dp_recv0((void *const *)buf, nb);
    const unsigned char **at = calloc((size_t)N, sizeof *at);
    if (!at) oom();
    for (int q = 1; q < N; q++) at[q] = buf[q];
    for (int i = 0, j = 0; i < count; i++) {
        int q = m->own[slot_of(m, it[i].s)];
        if (q == 0) it[i] = mine[j++];
        else at[q] = answer_take(at[q], &it[i], V);
    }
    for (int q = 1; q < N; q++) free(buf[q]);
    free(at); free(buf); free(nb); free(mine);
    dp_measure(&m->dpc, (ds41_session *const *)m->sess, m->own, m->n_sess, 0);
}

double ds41_smirror_beat_s(void) {
    double t = ds41_dist_timeout() / 3;
    return t < 0.05 ? 0.05 : t;
}

void ds41_smirror_beat(ds41_smirror *m) {
    if (m && now_s() - m->last >= ds41_smirror_beat_s()) flush(m);
}

void ds41_smirror_end(ds41_smirror *m) {
    if (!m) return;
    dp_report(&m->dpc);
    put1(m, DS41_SOP_END);
    flush(m);
}

/* ---------------------------------------------------------------- followers */

/* The sequences rank 0 opened: s is this rank's session, NULL for one another rank holds
 * (--dp-attention) */
typedef struct fslots {
    ds41_session **s;
    int32_t *id;
    int n, cap;
    unsigned char *ans;           /* --dp-attention: this rank's answers to a step */
    size_t ans_cap;
    int32_t *out;                 /* --spec: the verify blocks' outputs of a step (unread) */
    size_t out_cap;
    int32_t *dids;                /* a proposal's drafts and confidences (unread) */
    float *dconf;
    dp_count dpc;
} fslots;

static int slot_at(const fslots *f, int32_t id) {
    for (int i = 0; i < f->n; i++)
        if (f->id[i] == id) return i;
    return -1;
}

static ds41_session *slot_find(const fslots *f, int32_t id) {
    int i = slot_at(f, id);
    return i < 0 ? NULL : f->s[i];
}

/* --dp-attention: this rank's items of the step (the others' are theirs), run; then the
 * exchanges of the other ranks' forwards, then the answers to rank 0 */
static int step_own(ds41_engine *e, fslots *f, ds41_batch_item *items, int count, char *err, size_t errcap) {
    int n = 0, V = ds41_vocab_size(e);
    size_t bytes = 0;
    for (int k = 0; k < count; k++)
        if (items[k].s) {
            items[n++] = items[k];
            bytes += answer_bytes(&items[k], V);
        }
    if (n > 0) ds41_batch_step(items, n);   /* per-item failures go to rank 0 in the answers */
    ds41_dist_dp_done(&e->ctx);
    if (!n) return 0;
    dp_measure(&f->dpc, f->s, NULL, f->n, 0);
    if (bytes > f->ans_cap) {
        unsigned char *nb = realloc(f->ans, bytes);
        if (!nb) return snprintf(err, errcap, "out of memory for the answers of a step"), -1;
        f->ans = nb;
        f->ans_cap = bytes;
    }
    unsigned char *p = f->ans;
    for (int k = 0; k < n; k++) p = answer_put(p, &items[k], V);
    ds41_dist_dp_send0(f->ans, bytes);
    return 0;
}

static int apply(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp, fslots *f, const ds41_sop *op,
                 ds41_batch_item **items, int *items_cap, char *err, size_t errcap) {
    ds41_session *s = NULL;
    int dp = ds41_dist_dp(), me = ds41_dist_rank();
    if (op->op == DS41_SOP_CLOSE || op->op == DS41_SOP_RESTORE || op->op == DS41_SOP_PUBLISH) {
        s = slot_find(f, op->id);
        if (!s && !(dp && op->op == DS41_SOP_CLOSE && slot_at(f, op->id) >= 0))
            return snprintf(err, errcap, "serve mirror: rank 0 named session %d, which this rank does not hold", (int)op->id), -1;
    }
    if ((op->op == DS41_SOP_OPEN || op->op == DS41_SOP_OPEN_ON) && (op->op == DS41_SOP_OPEN_ON) != dp)
        return snprintf(err, errcap, "serve mirror: rank 0 sent %s, this rank runs %s", op->op == DS41_SOP_OPEN_ON ? "OPEN_ON" : "OPEN",
                        dp ? "--dp-attention" : "without --dp-attention"), -1;
    if (op->op == DS41_SOP_OPEN_ON && op->rank >= ds41_dist_size())
        return snprintf(err, errcap, "serve mirror: rank 0 gave session %d to rank %d of %d", (int)op->id, op->rank, ds41_dist_size()), -1;
    if ((op->op == DS41_SOP_DRAFT || op->op == DS41_SOP_CALIBRATE) && dp)
        return snprintf(err, errcap, "serve mirror: rank 0 sent %s, and --spec is not supported with --dp-attention",
                        op->op == DS41_SOP_DRAFT ? "DRAFT" : "CALIBRATE"), -1;
    if (op->op == DS41_SOP_EMBEDS && !(s = slot_find(f, op->id)))
        return snprintf(err, errcap, "serve mirror: rank 0 feeds an image prompt to session %d, which this rank does not hold",
                        (int)op->id), -1;
    if (op->op == DS41_SOP_DRAFT && !(s = slot_find(f, op->id)))
        return snprintf(err, errcap, "serve mirror: rank 0 drafts for session %d, which this rank does not hold", (int)op->id), -1;
    if ((op->op == DS41_SOP_RESTORE || op->op == DS41_SOP_PUBLISH || op->op == DS41_SOP_TRIM) && !pc)
        return snprintf(err, errcap, "serve mirror: rank 0 uses a prefix cache and this rank has none"), -1;
    switch (op->op) {
    case DS41_SOP_OPEN:
    case DS41_SOP_OPEN_ON: {
        if (slot_at(f, op->id) >= 0) return snprintf(err, errcap, "serve mirror: session %d opened twice", (int)op->id), -1;
        if (f->n == f->cap) {
            int nc = f->cap ? f->cap * 2 : 16;
            ds41_session **ns = realloc(f->s, (size_t)nc * sizeof *ns);
            if (!ns) return snprintf(err, errcap, "out of memory"), -1;
            f->s = ns;
            int32_t *ni = realloc(f->id, (size_t)nc * sizeof *ni);
            if (!ni) return snprintf(err, errcap, "out of memory"), -1;
            f->id = ni;
            f->cap = nc;
        }
        char eb[512];
        ds41_session *ns = NULL;
        if (op->op == DS41_SOP_OPEN || op->rank == me) {
            ns = ds41_session_open(e, sp, eb, sizeof eb);
            if (!ns) return snprintf(err, errcap, "serve mirror: cannot open a session as rank 0 did: %s", eb), -1;
        }
        f->s[f->n] = ns;
        f->id[f->n++] = op->id;
        f->dpc.seqs += ns != NULL;
        return 0;
    }
    case DS41_SOP_CLOSE:
        ds41_session_close(s);
        for (int i = 0; i < f->n; i++)
            if (f->id[i] == op->id) {
                f->s[i] = f->s[--f->n];
                f->id[i] = f->id[f->n];
                break;
            }
        return 0;
    case DS41_SOP_RESTORE:
        ds41_prefix_restore(pc, s, op->ids, op->n);   /* a failure is rank 0's too: its session says so */
        return 0;
    case DS41_SOP_PUBLISH:
        ds41_prefix_publish(pc, s, op->ids, op->n);
        return 0;
    case DS41_SOP_TRIM:
        ds41_prefix_trim(pc, op->bytes);
        return 0;
    case DS41_SOP_DRAFT: {
        int B = ds41_draft_block_size(e);
        if (B < 1) return snprintf(err, errcap, "serve mirror: rank 0 drafts and this rank's model has no DSpark stages"), -1;
        if (!f->dids) {
            f->dids = malloc((size_t)B * sizeof *f->dids);
            f->dconf = malloc((size_t)B * sizeof *f->dconf);
            if (!f->dids || !f->dconf) return snprintf(err, errcap, "out of memory"), -1;
        }
        ds41_session_draft(s, op->t_next, f->dids, f->dconf);   /* a failure is rank 0's too: it ends the sequence */
        return 0;
    }
    case DS41_SOP_CALIBRATE: {
        ds41_spec_curve c;
        char eb[512];
        ds41_spec_calibrate(e, op->width, op->prompt_len, op->reps, &c, eb, sizeof eb);   /* rank 0 uses its own curve */
        return 0;
    }
    case DS41_SOP_EMBEDS: {
        if (op->dim != ds41_model_dim(e))
            return snprintf(err, errcap, "serve mirror: rank 0's image rows are %d wide, this rank's model %d", op->dim, ds41_model_dim(e)), -1;
        float *emb = calloc(op->n * (size_t)op->dim, sizeof *emb);
        uint8_t *img = malloc(op->n);
        if (!emb || !img) { free(emb); free(img); return snprintf(err, errcap, "out of memory"), -1; }
        for (size_t j = 0, r = 0; j < op->n; j++) {
            img[j] = (uint8_t)op->flags[j];
            if (img[j]) memcpy(emb + j * (size_t)op->dim, op->rows + r++ * (size_t)op->dim, (size_t)op->dim * sizeof *emb);
        }
        ds41_feed_embeds(s, op->ids, op->n, emb, img);   /* a failure is rank 0's too: it ends the sequence */
        free(emb);
        free(img);
        return 0;
    }
    case DS41_SOP_STEP: {
        if (op->count > *items_cap) {
            ds41_batch_item *ni = realloc(*items, (size_t)op->count * sizeof *ni);
            if (!ni) return snprintf(err, errcap, "out of memory"), -1;
            *items = ni;
            *items_cap = op->count;
        }
        const int32_t *w = op->items;
        size_t nout = 0;
        for (int k = 0, at = 0; k < op->count; k++) {
            if (op->items[at + 2] == DS41_SOP_VERIFY) nout += (size_t)op->items[at + 1];
            at += 3 + op->items[at + 1];
        }
        if (nout > f->out_cap) {
            int32_t *no = realloc(f->out, nout * sizeof *no);
            if (!no) return snprintf(err, errcap, "out of memory"), -1;
            f->out = no;
            f->out_cap = nout;
        }
        nout = 0;
        for (int k = 0; k < op->count; k++) {
            ds41_batch_item *b = &(*items)[k];
            memset(b, 0, sizeof *b);
            b->s = slot_find(f, w[0]);
            if (!b->s && !(dp && slot_at(f, w[0]) >= 0))
                return snprintf(err, errcap, "serve mirror: rank 0's step names session %d, which this rank does not hold", (int)w[0]), -1;
            b->n = (size_t)w[1];
            b->ids = w + 3;
            if (w[2] == DS41_SOP_VERIFY) {
                if (dp) return snprintf(err, errcap, "serve mirror: rank 0's step verifies drafts, not supported with --dp-attention"), -1;
                b->verify = 1;
                b->out = f->out + nout;
                nout += b->n;
            } else {
                b->ahead = (size_t)w[2];
            }
            w += 3 + b->n;
        }
        if (dp) return step_own(e, f, *items, op->count, err, errcap);
        ds41_batch_step(*items, op->count);   /* per-item failures are rank 0's too */
        dp_measure(&f->dpc, f->s, NULL, f->n, 0);
        return 0;
    }
    default:
        return 1;   /* END */
    }
}

int ds41_smirror_follow(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp, char *err, size_t errcap) {
    /* a broken link is seen by both ends at about the same time: rank 0 answers its clients
     * (at most FAULT_ANSWER_S) and ends the job before this rank would */
    ds41_dist_set_fault_delay(FAULT_ANSWER_S + 1.0);
    fslots f;
    memset(&f, 0, sizeof f);
    if (!ds41_dist_dp()) ds41_spec_set_outcome_hook(share_outcome);   /* rank 0's outcomes, inside each verify */
    ds41_batch_item *items = NULL;
    int items_cap = 0, rc = -1;
    int32_t *buf = NULL;
    size_t cap = 0;
    for (;;) {
        int32_t len = 0;
        /* rank 0 beats every timeout / 3 while idle: silence past the timeout is a lost rank 0 */
        ds41_dist_bcast_wait(&len, sizeof len, ds41_dist_timeout());
        if (len < 0) { snprintf(err, errcap, "serve mirror: rank 0 sent a record of %d words", (int)len); break; }
        if (len == 0) continue;
        if ((size_t)len > cap) {
            int32_t *nb = realloc(buf, (size_t)len * sizeof *nb);
            if (!nb) { snprintf(err, errcap, "out of memory for rank 0's record of %d words", (int)len); break; }
            buf = nb;
            cap = (size_t)len;
        }
        ds41_dist_bcast(buf, (size_t)len * sizeof *buf);
        size_t at = 0;
        ds41_sop op;
        int r = 0, a = 0;
        while (a == 0 && (r = ds41_sop_next(buf, (size_t)len, &at, &op, err, errcap)) == 1)
            a = apply(e, pc, sp, &f, &op, &items, &items_cap, err, errcap);
        if (r < 0 || a < 0) break;
        if (a == 1) { rc = 0; break; }
    }
    dp_report(&f.dpc);
    for (int i = 0; i < f.n; i++) ds41_session_close(f.s[i]);
    ds41_spec_set_outcome_hook(NULL);
    free(f.s); free(f.id); free(f.ans); free(f.out); free(f.dids); free(f.dconf); free(items); free(buf);
    return rc;
}

/* ---------------------------------------------------------------- faults */

static ds41_sched *fault_sched;

static void on_fault(const char *msg) {
    /* the HTTP threads answer within a couple of seconds; the job ends after */
    if (fault_sched) ds41_sched_fail_all(fault_sched, msg, FAULT_ANSWER_S);
}

void ds41_smirror_on_fault(ds41_sched *S) {
    fault_sched = S;
    ds41_dist_set_fault_hook(S ? on_fault : NULL);
}
