/* ds41 speculative decoding: see spec.h and docs/speculative.md.
 *
 * Verify layout. A verify forward over [P, P+T) (T = 1 + K) runs every layer on every row
 * (no CED cut) and gives each row the KV list a single-token decode at its position builds
 * (forward.c, LAYOUT_VERIFY): the SWA part is the 128 (window) ring slots oldest -> newest in
 * decode order with the leading -1s of a ring not yet full, each slot resolved to the ring as
 * it was before the forward (positions < P) or to the chunk's key (positions P .. p; later
 * rows' keys are never listed); the compressed part is the same per-query top-k as decode:
 * scores over the entries visible at p, -inf beyond (so the top-k, candidate blocks and the
 * sorted selection are decode's, with trailing -1s where this forward's wider k exceeds
 * decode's, and an all -1 tail is an exact no-op of the 64-block recurrence). The official
 * index-K reading is emulated per row (ds41_ik_owner_after). Every other per-row computation
 * (Engram, mHC, compressor pooling, MoE, head) is row-independent in exact mode, so row i's
 * logits equal a decode's bit for bit.
 *
 * Rollback (ds41_cache_rollback): ring slots of rejected positions (every SWA and DSpark ring)
 * restored from the snapshot; the ratio-r compressor state rebuilt as decode leaves it (the
 * snapshot + row p mod r of each kept position from the forward's log); entries of groups
 * completed only by rejected rows zeroed and dropped, pages allocated for them freed; Engram
 * history recomputed; the published index-K owner of the official reading recomputed; DSpark
 * context rows and main_hidden cut to the kept rows. */
#define _GNU_SOURCE
#include "spec.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist.h"
#include "dist_pipe.h"
#include "dspark.h"
#include "kernels.h"
#include "lproc.h"

int ds41_spec_state_init(ds41_spec_state *st, const ds41_engine *e, ds41_err *err) {
    memset(st, 0, sizeof *st);
    const ds41_config *cfg = e->cfg;
    int B = cfg->n_mtp > 0 ? cfg->dspark_block_size : 0;
    st->cap = B + 1;
    if (st->cap > cfg->window) st->cap = cfg->window;
    if (st->cap < 1) st->cap = 1;
    st->pending = -1;
    st->probe_every = DS41_SPEC_PROBE_MIN;
    st->rows = malloc((size_t)st->cap * cfg->vocab_size * sizeof(float));
    if (!st->rows) return ds41_errf(err, "out of memory for the verify logits");
    return 0;
}

void ds41_spec_state_free(ds41_spec_state *st) {
    ds41_cache_snap_free(&st->snap);
    free(st->rows);
    memset(st, 0, sizeof *st);
    st->pending = -1;
}

/* forward over block[0..T) in the verify layout + DSpark seeding; leaves the cache ahead by T */
static int verify_forward(ds41_engine *e, ds41_seq *q, int draft, ds41_spec_state *st, const int32_t *block, int T,
                          ds41_err *err) {
    if (!st->snap.ring_old && ds41_cache_snap_init(&st->snap, &q->cache, st->cap, err)) return -1;
    if (T > st->cap) return ds41_errf(err, "verify: %d rows, at most %d", T, st->cap);
    if (ds41_cache_snapshot(&q->cache, &st->snap, T, err)) return -1;
    q->verify = 1;
    int rc = ds41_forward_rows(q, block, T, st->rows, err);
    q->verify = 0;
    if (rc) return -1;
    if (draft && ds41_dspark_seed(e, &q->cache, q->main_hidden, q->mh_rows, q->mh_pos0, err)) return -1;
    return 0;
}

static void rollback(ds41_engine *e, ds41_seq *q, ds41_spec_state *st, const int32_t *block, int keep) {
    const ds41_config *cfg = e->cfg;
    long long P = st->snap.P;
    int owner = keep > 0 ? ds41_ik_owner_after(cfg, st->snap.ik_owner, P, P + keep - 1, cfg->n_layers - 1)
                         : st->snap.ik_owner;
    ds41_cache_rollback(&q->cache, &st->snap, keep, block, e->has_engram ? e->token_map : NULL, owner);
    if (q->main_hidden && q->mh_pos0 == P && q->mh_rows > keep) q->mh_rows = keep;
    if (keep > 0)
        memcpy(q->logits, st->rows + (size_t)(keep - 1) * cfg->vocab_size, (size_t)cfg->vocab_size * sizeof(float));
}

int ds41_spec_time_forward(ds41_engine *e, ds41_seq *q, ds41_spec_state *st, const int32_t *tokens, int T,
                           ds41_err *err) {
    if (verify_forward(e, q, 0, st, tokens, T, err)) return -1;
    rollback(e, q, st, tokens, 0);
    return 0;
}

/* is id among the m ascending kept ids? */
static int kept(const int *ids, int m, int id) {
    int lo = 0, hi = m - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (ids[mid] == id) return 1;
        if (ids[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

int ds41_spec_verify_begin(ds41_engine *e, ds41_seq *q, ds41_spec_state *st, int32_t t_next, const int32_t *drafts,
                           int k, int32_t *block, ds41_err *err) {
    int V = e->cfg->vocab_size, T = 1 + k;
    if (k < 0 || T > st->cap || k > DS41_SPEC_MAX_DRAFTS) return ds41_errf(err, "verify: %d drafts, at most %d", k, st->cap - 1);
    if (q->cache.pos < 1) return ds41_errf(err, "verify: needs a prompt first");
    if (q->cache.pos + T > q->cache.max_pos)
        return ds41_errf(err, "verify: positions %lld..%lld exceed the context size %lld", q->cache.pos,
                         q->cache.pos + T - 1, q->cache.max_pos);
    block[0] = t_next;
    for (int i = 0; i < k; i++) block[1 + i] = drafts[i];
    for (int i = 0; i < T; i++)
        if (block[i] < 0 || block[i] >= V) return ds41_errf(err, "verify: token %d outside the vocabulary", block[i]);
    if (!st->snap.ring_old && ds41_cache_snap_init(&st->snap, &q->cache, st->cap, err)) return -1;
    if (ds41_cache_snapshot(&q->cache, &st->snap, T, err)) return -1;
    q->verify = 1;
    return T;
}

int ds41_spec_verify_block(ds41_engine *e, ds41_seq *q, ds41_sampler *smp, int draft, ds41_spec_state *st,
                           int32_t t_next, const int32_t *drafts, int k, int32_t *out, float *out_logits, int *n_acc,
                           ds41_err *err) {
    int32_t block[DS41_SPEC_MAX_DRAFTS + 1];
    int T = ds41_spec_verify_begin(e, q, st, t_next, drafts, k, block, err);
    if (T < 0) return -1;
    int rc = ds41_forward_rows(q, block, T, st->rows, err);
    q->verify = 0;
    if (rc) return -1;
    return ds41_spec_verify_end(e, q, smp, draft, st, block, k, out, out_logits, n_acc, err);
}

/* row processed by lp past tail[0..n) into buf (row itself when lp does nothing). */
static const float *proc_row(ds41_lproc *lp, const float *row, int V, const int32_t *tail, int n, float *buf) {
    if (!ds41_lproc_active(lp)) return row;
    memcpy(buf, row, (size_t)V * sizeof(float));
    ds41_lproc_apply(lp, buf, tail, n);
    return buf;
}

static ds41_spec_outcome_fn outcome_hook;

void ds41_spec_set_outcome_hook(ds41_spec_outcome_fn fn) { outcome_hook = fn; }

/* The verify's outcome kept: rollback to the A accepted drafts, out[0..A] = those drafts and
 * next, their logits rows, next pending. Returns A + 1. */
static int keep_rows(ds41_engine *e, ds41_seq *q, ds41_spec_state *st, const int32_t *block, int A, int32_t next,
                     int32_t *out, float *out_logits, int *n_acc) {
    size_t V = (size_t)e->cfg->vocab_size;
    rollback(e, q, st, block, A + 1);
    for (int i = 0; i < A; i++) out[i] = block[1 + i];
    out[A] = next;
    if (out_logits) memcpy(out_logits, st->rows, (size_t)(A + 1) * V * sizeof(float));
    st->pending = next;
    if (n_acc) *n_acc = A;
    return A + 1;
}

int ds41_spec_verify_end(ds41_engine *e, ds41_seq *q, ds41_sampler *smp, int draft, ds41_spec_state *st,
                         const int32_t *block, int k, int32_t *out, float *out_logits, int *n_acc, ds41_err *err) {
    return ds41_spec_verify_end_as(e, q, smp, draft, st, block, k, out, out_logits, n_acc, err, NULL, NULL);
}

int ds41_spec_verify_end_as(ds41_engine *e, ds41_seq *q, ds41_sampler *smp, int draft, ds41_spec_state *st,
                            const int32_t *block, int k, int32_t *out, float *out_logits, int *n_acc, ds41_err *err,
                            const int32_t *given, int32_t *decided) {
    const ds41_config *cfg = e->cfg;
    int V = cfg->vocab_size;
    const int32_t *drafts = block + 1;
    q->verify = 0;
    if (draft && ds41_dspark_seed(e, &q->cache, q->main_hidden, q->mh_rows, q->mh_pos0, err)) return -1;
    if (given) {   /* another rank decided (this one may not hold the rows' logits) */
        if (given[0] < 0 || given[0] > k || given[1] < 0 || given[1] >= V)
            return ds41_errf(err, "the shared verify outcome (%d of %d drafts accepted, next token %d) is out of range",
                             (int)given[0], k, (int)given[1]);
        return keep_rows(e, q, st, block, given[0], given[1], out, out_logits, n_acc);
    }

    float *scratch = malloc((size_t)V * sizeof(float));
    int *ids = malloc((size_t)V * sizeof(int));
    int proc = ds41_lproc_active(smp->lp);
    float *prow = proc ? malloc((size_t)V * sizeof(float)) : NULL;
    if (!scratch || !ids || (proc && !prow)) { free(scratch); free(ids); free(prow); return ds41_errf(err, "out of memory"); }
    int greedy = !(smp->temperature > 0.0f);
    int A = 0, next = -1;
    for (; A < k; A++) {
        /* the same processing as a plain step's (ds41_session_sample), past the drafts before
         * this row: a draft the processor refuses (a grammar's mask) has p = 0 and is rejected */
        const float *row = proc_row(smp->lp, st->rows + (size_t)A * V, V, drafts, A, prow);
        int d = drafts[A];
        if (greedy) {
            int g = ds41_argmax(row, V);
            if (g != d) { next = g; break; }
            continue;
        }
        int m = ds41_sample_filter(smp, row, V, scratch, ids);
        if (m < 0) {   /* degenerate row: one forced token */
            if (-m - 1 != d) { next = -m - 1; break; }
            continue;
        }
        double sum = 0.0;
        for (int i = 0; i < m; i++) sum += scratch[ids[i]];
        double pd = kept(ids, m, d) && sum > 0 ? scratch[d] / sum : 0.0;
        /* q is a point mass at d: accept with probability min(1, p(d)/q(d)) = p(d) */
        if (pd > 0.0 && ds41_sampler_uniform(smp) < pd) continue;
        /* residual max(p - q, 0) renormalised = p without d, renormalised: the exponential
         * race over the kept tokens other than d */
        next = ds41_sample_race(smp, scratch, ids, m, d);
        if (next < 0) next = d;   /* cannot happen: p(d) = 1 is always accepted */
        break;
    }
    if (next < 0) {   /* every draft accepted: the next token from the last row */
        const float *row = proc_row(smp->lp, st->rows + (size_t)k * V, V, drafts, k, prow);
        next = greedy ? ds41_argmax(row, V) : ds41_sample(smp, row, V, scratch, ids);
    }
    free(scratch);
    free(ids);
    free(prow);
    if (decided) {   /* this rank decides for the others, which take it (given) */
        decided[0] = A;
        decided[1] = next;
    }
    /* --split layers (a command): the last stage's acceptance for every rank (only its
     * sampler draws: ids after the last stage) */
    if (!decided && !outcome_hook && e->pipe && ds41_pipe_ids(e->pipe)) {
        int32_t v[2] = { A, next };
        ds41_pipe_spec(e->pipe, v, sizeof v, 3, "the verify outcome, from the last stage");
        if (v[0] < 0 || v[0] > k || v[1] < 0 || v[1] >= V)
            return ds41_errf(err, "the last stage's verify outcome (%d of %d drafts accepted, next token %d) is out of range",
                             (int)v[0], k, (int)v[1]);
        A = v[0];
        next = v[1];
    }
    if (!decided && outcome_hook) {
        int32_t v[2] = { A, next };
        char eb[256];
        if (outcome_hook(v, k, eb, sizeof eb)) return ds41_errf(err, "%s", eb);
        if (v[0] < 0 || v[0] > k || v[1] < 0 || v[1] >= V)
            return ds41_errf(err, "the shared verify outcome (%d of %d drafts accepted, next token %d) is out of range",
                             (int)v[0], k, (int)v[1]);
        A = v[0];
        next = v[1];
    }
    return keep_rows(e, q, st, block, A, next, out, out_logits, n_acc);
}

/* ====================================================================== scheduler (5.4) */

double ds41_spec_curve_sps(const ds41_spec_curve *c, int w) {
    if (!c || c->n < 1) return 1.0;
    if (w < 1) w = 1;
    if (w <= c->n) return c->sps[w];
    if (c->n < 2) return c->sps[c->n] / w;   /* time proportional to width */
    double t1 = 1.0 / c->sps[c->n - 1], t2 = 1.0 / c->sps[c->n];
    double slope = t2 - t1;
    if (slope < 0) slope = 0;
    return 1.0 / (t2 + slope * (w - c->n));
}

typedef struct cand { double a; int r, j; } cand;
static int cmp_cand(const void *x, const void *y) {
    const cand *a = x, *b = y;
    if (a->a > b->a) return -1;
    if (a->a < b->a) return 1;
    if (a->j != b->j) return a->j - b->j;
    return a->r - b->r;
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

double ds41_spec_step_time(const ds41_spec_curve *c, int R, int width, int drafting) {
    double t = 1.0 / ds41_spec_curve_sps(c, width);
    if (c && drafting > 0 && c->propose_s > 0) {
        int d = width - R > 0 ? width - R : 0;
        t += drafting * c->propose_s + d * c->draft_s;
    }
    return t;
}

double ds41_spec_theta(const ds41_spec_curve *c, int R, int width, int drafting, double tau) {
    if (!c || c->n < 1) return tau;   /* no curve: tokens per step */
    return tau / ds41_spec_step_time(c, R, width, drafting);
}

double ds41_spec_schedule(const ds41_spec_curve *curve, int R, int stride, const float *conf, const int *max_len,
                          int *len) {
    if (R <= 0) return 0.0;
    size_t nc = 0;
    int drafting = 0;   /* sequences that proposed: their proposals are part of the step's time */
    for (int r = 0; r < R; r++) {
        nc += (size_t)(max_len[r] > 0 ? max_len[r] : 0);
        drafting += max_len[r] > 0;
    }
    cand *c = malloc((nc ? nc : 1) * sizeof *c);
    double tau = R;
    for (int r = 0; r < R; r++) len[r] = 0;
    if (!c) return tau;
    size_t n = 0;
    for (int r = 0; r < R; r++) {
        double a = 1.0;
        for (int j = 0; j < max_len[r] && j < stride; j++) {
            a *= sigm(conf[(size_t)r * stride + j]);
            c[n].a = a; c[n].r = r; c[n].j = j;
            n++;
        }
    }
    qsort(c, n, sizeof *c, cmp_cand);
    int B = R;
    double theta = ds41_spec_theta(curve, R, B, drafting, tau);
    for (size_t i = 0; i < n; i++) {
        if (c[i].j != len[c[i].r]) continue;   /* not the next of its prefix (ties out of order) */
        double t2 = tau + c[i].a;
        double th2 = ds41_spec_theta(curve, R, B + 1, drafting, t2);
        if (!(th2 > theta)) break;
        tau = t2;
        theta = th2;
        B++;
        len[c[i].r]++;
    }
    free(c);
    return tau;
}

/* ====================================================================== drafting gate */

double ds41_spec_survival(const ds41_spec_state *st, int j) {
    double s = 1.0;
    for (int i = 0; i <= j && i < DS41_SPEC_MAX_DRAFTS; i++) {
        /* prior: half the previous position's survival, worth one observation */
        double prior = 0.5 * s;
        double v = (st->acc_num[i] + prior) / (st->acc_den[i] + 1.0);
        s = v < s ? v : s;
    }
    return s;
}

void ds41_spec_observe(ds41_spec_state *st, int k, int accepted) {
    if (k <= 0) return;
    for (int i = 0; i < k && i < DS41_SPEC_MAX_DRAFTS; i++) {
        st->acc_den[i] = st->acc_den[i] * DS41_SPEC_DECAY + 1.0;
        st->acc_num[i] = st->acc_num[i] * DS41_SPEC_DECAY + (accepted > i ? 1.0 : 0.0);
    }
}

double ds41_spec_best_theta(const ds41_spec_curve *c, int kmax, const double *surv, int *best_k) {
    double best = 0.0, tau = 1.0;
    if (best_k) *best_k = 0;
    for (int k = 1; k <= kmax; k++) {
        tau += surv ? surv[k - 1] : 1.0;
        double th = ds41_spec_theta(c, 1, 1 + k, 1, tau);
        if (th > best) { best = th; if (best_k) *best_k = k; }
    }
    return best;
}

int ds41_spec_probe_floor(const ds41_spec_curve *c, int first) {
    if (!c || c->n < 1 || !(c->propose_s > 0)) return DS41_SPEC_PROBE_MIN;
    /* a probe: the deferred ring writes of the dormant spell (flush_s: a window of them, as
     * many as a spell of at least a window leaves), the proposal's stages and one draft; the
     * session's first on new buffers (cold_s, measured whole) */
    double probe = c->propose_s + c->draft_s + (c->flush_s > 0 ? c->flush_s : 0);
    if (first && c->cold_s > probe) probe = c->cold_s;
    double steps = probe * ds41_spec_curve_sps(c, 1) / DS41_SPEC_PROBE_BUDGET;
    if (!(steps < DS41_SPEC_PROBE_MAX)) return DS41_SPEC_PROBE_MAX;
    int n = (int)ceil(steps - 1e-9);   /* 55.000000000001 steps is 55 */
    return n < DS41_SPEC_PROBE_MIN ? DS41_SPEC_PROBE_MIN : n;
}

int ds41_spec_gate(ds41_spec_state *st, const ds41_spec_curve *c, int kmax) {
    if (kmax <= 0) return 0;
    st->dormant = 0;
    if (!c || c->n < 1 || !(c->propose_s > 0)) return 1;   /* proposal cost unknown: always propose */
    double plain = ds41_spec_theta(c, 1, 1, 0, 1.0);
    /* even a drafter that is always right cannot beat a plain step: never propose */
    if (!(ds41_spec_best_theta(c, kmax, NULL, NULL) > plain)) { st->dormant = 1; return 0; }
    double surv[DS41_SPEC_MAX_DRAFTS];
    if (kmax > DS41_SPEC_MAX_DRAFTS) kmax = DS41_SPEC_MAX_DRAFTS;
    for (int j = 0; j < kmax; j++) surv[j] = ds41_spec_survival(st, j);
    if (ds41_spec_best_theta(c, kmax, surv, NULL) > plain) {
        st->plain_run = 0;
        st->probe_every = DS41_SPEC_PROBE_MIN;
        st->opened = 1;
        return 1;
    }
    /* the recent acceptance says drafting does not pay; propose now and then to notice when
     * the text becomes predictable, less often while the probes keep failing, and never so
     * often that the probes cost more than DS41_SPEC_PROBE_BUDGET of the decode time (on the
     * demo model a probe is about 0.7 of a decode step plus the deferred ring writes it
     * flushes: every 8 steps cost 4-5 %) */
    int every = ds41_spec_probe_floor(c, !st->opened);
    if (st->probe_every > every) every = st->probe_every;
    if (++st->plain_run >= every) {
        st->plain_run = 0;
        st->probe_every = every * 2 > DS41_SPEC_PROBE_MAX ? DS41_SPEC_PROBE_MAX : every * 2;
        st->opened = 1;
        return 1;
    }
    st->dormant = 1;
    return 0;
}

/* ====================================================================== curve */

/* The calibration's clock: single-threaded, the thread's CPU time (what the work costs,
 * whatever share of the core the other processes of a shared machine take); with a thread
 * pool, wall time (the workers' time is not the caller's). */
static double cal_now(const ds41_engine *e) {
    struct timespec ts;
    clock_gettime(e->ctx.pool ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define DS41_SPEC_CAL_MAX_REPS 64

/* Calibration state: the scratch sequence after the prompt and one decode (so a proposal at its
 * last position P has its context row), a copy of that row, the proposal's scratch. */
typedef struct cal {
    ds41_engine *e;
    ds41_seq q;
    ds41_spec_state st;
    ds41_dspark_work *w;     /* NULL: no DSpark stages */
    float *mh;               /* main_hidden row of P */
    long long P;
    int32_t t_next;
    const int32_t *vblock;   /* the verify rows' tokens (max_width of them) */
} cal;

/* one proposal with a single draft, untimed: what a drafting step runs before its verify */
static int cal_propose(cal *c, ds41_err *err) {
    int32_t id;
    if (ds41_dspark_begin(c->e, &c->q.cache, c->w, c->mh, c->P, c->t_next, 1, err)) return -1;
    if (ds41_dspark_next(c->e, c->w, NULL, &id)) return ds41_errf(err, "calibrate: draft");
    return 0;
}

int ds41_spec_calibrate(ds41_engine *e, int max_width, int prompt_len, int reps, ds41_spec_curve *out, char *errbuf,
                        size_t errcap) {
    ds41_err err;
    memset(out, 0, sizeof *out);
    const ds41_config *cfg = e->cfg;
    if (max_width < 1) max_width = 1;
    if (max_width > DS41_SPEC_MAX_WIDTH) max_width = DS41_SPEC_MAX_WIDTH;
    if (max_width > cfg->window) max_width = cfg->window;
    if (reps < 1) reps = 1;
    if (prompt_len < 2) prompt_len = 2;
    if (prompt_len + 1 + max_width > e->max_pos) prompt_len = (int)(e->max_pos - max_width - 1);
    if (prompt_len < 1) { snprintf(errbuf, errcap, "calibrate: the context is too small"); return -1; }
    cal c;
    memset(&c, 0, sizeof c);
    c.e = e;
    if (ds41_seq_init(&c.q, e, &err)) { snprintf(errbuf, errcap, "%s", err.msg); return -1; }
    if (ds41_spec_state_init(&c.st, e, &err)) { ds41_seq_free(&c.q); snprintf(errbuf, errcap, "%s", err.msg); return -1; }
    if (c.st.cap < max_width) {
        free(c.st.rows);
        c.st.cap = max_width;
        c.st.rows = malloc((size_t)max_width * cfg->vocab_size * sizeof(float));
    }
    int B = ds41_draft_block_size(e);
    size_t mhw = (size_t)cfg->n_dspark_targets * cfg->dim;
    int32_t *tok = malloc((size_t)(prompt_len + 1 + max_width) * sizeof(int32_t));
    if (reps > DS41_SPEC_CAL_MAX_REPS) reps = DS41_SPEC_CAL_MAX_REPS;
    double *t = malloc((size_t)max_width * DS41_SPEC_CAL_MAX_REPS * sizeof(double));
    double *tb = malloc(4 * DS41_SPEC_CAL_MAX_REPS * sizeof(double)), *td = malloc(4 * DS41_SPEC_CAL_MAX_REPS * sizeof(double));
    int rc = -1;
    if (!tok || !t || !tb || !td || !c.st.rows) { snprintf(errbuf, errcap, "out of memory"); goto done; }
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < prompt_len + 1 + max_width; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        tok[i] = (int32_t)(x % (uint64_t)cfg->vocab_size);
    }
    /* the prompt, then one decode: position P = prompt_len has a DSpark context row */
    if (ds41_forward(&c.q, tok, prompt_len + 1, 1, &err)) { snprintf(errbuf, errcap, "%s", err.msg); goto done; }
    c.P = prompt_len;
    c.t_next = tok[prompt_len];
    c.vblock = tok + prompt_len + 1;
    if (B > 0) {
        if (ds41_dspark_seed(e, &c.q.cache, c.q.main_hidden, c.q.mh_rows, c.q.mh_pos0, &err)) {
            snprintf(errbuf, errcap, "%s", err.msg);
            goto done;
        }
        if (!c.q.main_hidden || c.q.mh_rows < 1 || !(c.mh = malloc(mhw * sizeof(float))) ||
            (!(e->pipe && !ds41_pipe_last(e->pipe)) && !(c.w = ds41_dspark_work_new(e, &err)))) {
            snprintf(errbuf, errcap, "calibrate: no DSpark context row or out of memory");
            goto done;
        }
        memcpy(c.mh, c.q.main_hidden + (size_t)(c.q.mh_rows - 1) * mhw, mhw * sizeof(float));
    }
    /* The widths: a warm-up of each; then rounds over the widths in turn, so that a noisy
     * spell on a shared machine spreads over all widths instead of bending one, as many rounds
     * as fit in about 0.3 s (at least reps, at most DS41_SPEC_CAL_MAX_REPS); the lower quartile
     * of each width's times (cal_now: CPU time single-threaded; with a pool the wall clock,
     * where a time slice given to another process lands in many single measurements of a few
     * ms). Before each verify of width >= 2 an untimed proposal runs, as in a drafting step
     * (the stages' weights pass through the caches between two backbone forwards); width 1
     * is a plain step and runs after a plain step. */
    double round_s = 0;
    for (int w = 1; w <= max_width; w++) {
        double t0 = cal_now(e);
        if (ds41_spec_time_forward(e, &c.q, &c.st, c.vblock, w, &err)) { snprintf(errbuf, errcap, "%s", err.msg); goto done; }
        round_s += cal_now(e) - t0;
    }
    if (round_s > 0 && 0.3 / round_s > reps) reps = 0.3 / round_s < DS41_SPEC_CAL_MAX_REPS ? (int)(0.3 / round_s) : DS41_SPEC_CAL_MAX_REPS;
    /* under mpiexec the calibration's forwards are collective: every rank runs rank 0's count
     * (under serve --dp-attention rank 0 calibrates alone and the other ranks join its forwards) */
    if (!ds41_dist_dp() && ds41_dist_bcast(&reps, sizeof reps)) { snprintf(errbuf, errcap, "calibrate: the ranks could not agree on the rounds"); goto done; }
    for (int r = 0; r < reps; r++)
        for (int w = 1; w <= max_width; w++) {
            if (c.w && w >= 2 && cal_propose(&c, &err)) { snprintf(errbuf, errcap, "%s", err.msg); goto done; }
            double t0 = cal_now(e);
            if (ds41_spec_time_forward(e, &c.q, &c.st, c.vblock, w, &err)) { snprintf(errbuf, errcap, "%s", err.msg); goto done; }
            t[(size_t)(w - 1) * DS41_SPEC_CAL_MAX_REPS + r] = cal_now(e) - t0;
        }
    for (int w = 1; w <= max_width; w++) {
        double *tw = t + (size_t)(w - 1) * DS41_SPEC_CAL_MAX_REPS;
        qsort(tw, (size_t)reps, sizeof(double), cmp_dbl);
        double q1 = tw[reps / 4];
        out->sps[w] = q1 > 0 ? 1.0 / q1 : 1e9;
        out->n = w;
    }
    /* The proposal: the stages (ds41_dspark_begin), then each draft (confidence + head +
     * Markov), 4 x reps times, each after an untimed verify of width 2 (as in decoding, after
     * a backbone forward), lower quartiles. */
    if (c.w) {
        int n = 4 * reps;
        for (int r = -1; r < n; r++) {   /* r = -1: a warm-up */
            if (ds41_spec_time_forward(e, &c.q, &c.st, c.vblock, max_width < 2 ? 1 : 2, &err)) {
                snprintf(errbuf, errcap, "%s", err.msg);
                goto done;
            }
            double t0 = cal_now(e);
            if (ds41_dspark_begin(e, &c.q.cache, c.w, c.mh, c.P, c.t_next, 1, &err)) { snprintf(errbuf, errcap, "%s", err.msg); goto done; }
            double t1 = cal_now(e);
            for (int k = 0; k < B; k++) {
                float cf;
                int32_t id;
                if (ds41_dspark_conf(e, c.w, k, &cf) || ds41_dspark_next(e, c.w, NULL, &id)) {
                    snprintf(errbuf, errcap, "calibrate: draft %d", k);
                    goto done;
                }
            }
            double t2 = cal_now(e);
            if (r >= 0) { tb[r] = t1 - t0; td[r] = (t2 - t1) / B; }
        }
        qsort(tb, (size_t)n, sizeof(double), cmp_dbl);
        qsort(td, (size_t)n, sizeof(double), cmp_dbl);
        out->propose_s = tb[n / 4] > 0 ? tb[n / 4] : 1e-9;
        out->draft_s = td[n / 4] > 0 ? td[n / 4] : 1e-9;
        /* The flush a probe pays after a dormant spell (session.c, seed_flush): one
         * ds41_dspark_seed of a window of context rows (copies of P's row, at positions from 0:
         * the scratch sequence's stage rings are not read after this), reps times after a
         * warm-up, the lower quartile. */
        int nf = cfg->window < e->max_pos ? cfg->window : (int)e->max_pos;
        float *rows = nf > 0 ? malloc((size_t)nf * mhw * sizeof(float)) : NULL;
        if (!rows) { snprintf(errbuf, errcap, "out of memory"); goto done; }
        for (int i = 0; i < nf; i++) memcpy(rows + (size_t)i * mhw, c.mh, mhw * sizeof(float));
        for (int r = -1; r < reps; r++) {
            double t0 = cal_now(e);
            if (ds41_dspark_seed(e, &c.q.cache, rows, nf, 0, &err)) {
                free(rows);
                snprintf(errbuf, errcap, "%s", err.msg);
                goto done;
            }
            if (r >= 0) tb[r] = cal_now(e) - t0;
        }
        qsort(tb, (size_t)reps, sizeof(double), cmp_dbl);
        out->flush_s = tb[reps / 4] > 0 ? tb[reps / 4] : 1e-9;
        /* The session's first probe, cold: its buffers are new (the deferred rows' buffer,
         * filled as the dormant steps fill it; the proposal's work buffer; the thread's linear
         * scratch, which grows to the flush's rows), so their pages fault in (about 12 us a
         * page on the VMs here). Each round releases this thread's scratch and returns the
         * freed memory to the kernel (malloc_trim) first; with a thread pool the workers'
         * scratch stays (warm). The median of reps rounds. */
        for (int r = 0; r < reps; r++) {
            ds41_scratch_release();
            malloc_trim(0);
            double t0 = cal_now(e);
            float *dp = malloc((size_t)nf * mhw * sizeof(float));
            ds41_dspark_work *w2 = dp ? ds41_dspark_work_new(e, &err) : NULL;
            int crc = !dp || !w2;
            if (!crc) {
                memcpy(dp, rows, (size_t)nf * mhw * sizeof(float));
                crc = ds41_dspark_seed(e, &c.q.cache, dp, nf, 0, &err) ||
                      ds41_dspark_begin(e, &c.q.cache, w2, c.mh, c.P, c.t_next, 1, &err);
                float cf;
                int32_t id;
                if (!crc) crc = ds41_dspark_conf(e, w2, 0, &cf) || ds41_dspark_next(e, w2, NULL, &id);
            }
            tb[r] = cal_now(e) - t0;
            free(dp);
            ds41_dspark_work_free(w2);
            if (crc) {
                free(rows);
                snprintf(errbuf, errcap, "calibrate: the cold probe failed: %s", err.msg);
                goto done;
            }
        }
        free(rows);
        qsort(tb, (size_t)reps, sizeof(double), cmp_dbl);
        out->cold_s = tb[reps / 2] > 0 ? tb[reps / 2] : 1e-9;
    }
    /* --split layers (the commands and serve): the drafter runs on the last stage only; its
     * timing for every rank (the verify widths' untimed proposals and these are skipped
     * elsewhere) */
    if (B > 0 && ds41_pipe_stages(e->pipe) > 1) {
        double pd[4] = { out->propose_s, out->draft_s, out->flush_s, out->cold_s };
        if (!ds41_pipe_last(e->pipe)) {   /* the same verifies as the last stage runs above, untimed */
            for (int r = -1; r < 4 * reps; r++)
                if (ds41_spec_time_forward(e, &c.q, &c.st, c.vblock, max_width < 2 ? 1 : 2, &err)) {
                    snprintf(errbuf, errcap, "%s", err.msg);
                    goto done;
                }
        }
        ds41_pipe_spec(e->pipe, pd, sizeof pd, 4, "the proposal's timing, from the last stage");
        out->propose_s = pd[0];
        out->draft_s = pd[1];
        out->flush_s = pd[2];
        out->cold_s = pd[3];
    }
    rc = 0;
done:
    free(tok);
    free(t);
    free(tb);
    free(td);
    free(c.mh);
    ds41_dspark_work_free(c.w);
    ds41_spec_state_free(&c.st);
    ds41_seq_free(&c.q);
    return rc;
}

int ds41_spec_curve_path(const char *model_dir, int n_threads, int exact, char *buf, size_t cap) {
    const char *env = getenv("DS41_SPEC_CURVE");
    if (env && *env) return snprintf(buf, cap, "%s", env) < (int)cap ? 0 : -1;
    char *rp = realpath(model_dir, NULL);
    const char *d = rp ? rp : model_dir;
    uint64_t h = 0xcbf29ce484222325ULL;
    /* the format: a curve cached before flush_s was measured has another name, so it is
     * measured again (an explicit $DS41_SPEC_CURVE without flush_s is taken as it is) */
    h = ds41_digest_bytes(h, "flush_s", 7);
    h = ds41_digest_bytes(h, d, strlen(d));
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/config.json", d);
    struct stat sb;
    if (stat(cpath, &sb) == 0) {
        long long v[2] = { (long long)sb.st_size, (long long)sb.st_mtime };
        h = ds41_digest_bytes(h, v, sizeof v);
    }
    free(rp);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[4096];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/ds41", xdg);
    else if (home && *home) snprintf(base, sizeof base, "%s/.cache/ds41", home);
    else return -1;
    int n = snprintf(buf, cap, "%s/spec-curve-%016llx-t%d-%s.txt", base, (unsigned long long)h, n_threads,
                     exact ? "exact" : "fast");
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

int ds41_spec_curve_load(const char *path, ds41_spec_curve *c) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    memset(c, 0, sizeof *c);
    char line[256];
    int have_propose = 0, bad = 0;
    while (!bad && fgets(line, sizeof line, f)) {
        int w;
        double v;
        char key[32];
        if (sscanf(line, "%d %lf", &w, &v) == 2) {
            if (w != c->n + 1 || w > DS41_SPEC_MAX_WIDTH || !(v > 0)) bad = 1;
            else { c->sps[w] = v; c->n = w; }
        } else if (sscanf(line, "%31s %lf", key, &v) == 2) {
            if (!(v >= 0) || v > 1e6) bad = 1;
            else if (!strcmp(key, "propose_s")) { c->propose_s = v; have_propose = 1; }
            else if (!strcmp(key, "draft_s")) c->draft_s = v;
            else if (!strcmp(key, "flush_s")) c->flush_s = v;
            else if (!strcmp(key, "cold_s")) c->cold_s = v;
            /* other keys: from a later format, ignored */
        } else if (line[0] != '\n') {
            bad = 1;
        }
    }
    fclose(f);
    /* a file without the proposal's cost is from before it was measured: re-measure */
    if (bad || c->n < 1 || !have_propose) { memset(c, 0, sizeof *c); return -1; }
    return 0;
}

static void mkdirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0777); *p = '/'; }
}

int ds41_spec_curve_save(const char *path, const ds41_spec_curve *c) {
    mkdirs(path);
    /* a temporary file renamed over the name: a reader (another process measuring or loading
     * the same curve) sees the old file or the new one, never a partial one */
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return -1;
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) { free(tmp); return -1; }
    for (int w = 1; w <= c->n; w++) fprintf(f, "%d %.6f\n", w, c->sps[w]);
    /* after the widths: a loader of the older format stops here with the widths read */
    fprintf(f, "propose_s %.9f\ndraft_s %.9f\nflush_s %.9f\ncold_s %.9f\n", c->propose_s, c->draft_s, c->flush_s,
            c->cold_s);
    int rc = fclose(f) ? -1 : rename(tmp, path) ? -1 : 0;
    if (rc) remove(tmp);
    free(tmp);
    return rc;
}
