/* ds41 serve: scheduler (serve_sched.h). Lock order: S->mu before g->mu; the HTTP threads
 * take g->mu alone or S->mu alone, never g->mu then S->mu. */
#define _GNU_SOURCE
#include "serve_sched.h"
#include "serve_gprefetch.h"

#include "serve_mpi.h"
#include "serve_req.h"
#include "cli_vprompt.h"
#include "serve_vision.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ds41_sched {
    ds41_engine *e;
    const ds41_tokenizer *tok;
    ds41_sched_params p;
    ds41_metrics *m;
    int V, eos;
    long long ctx;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    /* waiting FIFO (ring of max_queue) and running set; S->mu */
    ds41_sseq **q;
    int q_head, q_len;
    ds41_sseq **run;
    int n_run;
    long long kv_reserved, kv_used, sessions_open;
    char *piece;     /* detok scratch */
    size_t piece_cap;
    /* speculative decoding: block size, curve, per batch slot the verify block, its output,
     * proposals and (for logprobs, allocated on first use) the logits rows */
    int B;
    ds41_spec_curve curve;
    int32_t *vblk, *vout;      /* [parallel][B + 2] */
    float *conf;               /* [parallel][B] */
    float **vlg;               /* [parallel] -> [B + 1][V] */
    /* grammar masks computed beside the forward (serve_gprefetch.h): started on the scheduler
     * thread when the first constrained sequence samples */
    ds41_gprefetch *pf;
    int pf_tried;
    ds41_gmatch **pf_gm;       /* [parallel] */
    int *pf_state;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- groups */

ds41_sgroup *ds41_sgroup_new(int n_seq) {
    ds41_sgroup *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->seq = calloc((size_t)(n_seq > 0 ? n_seq : 1), sizeof *g->seq);
    if (!g->seq) { free(g); return NULL; }
    g->n_seq = n_seq;
    g->refs = 1;
    g->skip_special = 1;
    atomic_init(&g->cancel, 0);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int i = 0; i < n_seq; i++) {
        g->seq[i].g = g;
        g->seq[i].n_top = -1;
        ds41_lproc_init(&g->seq[i].proc, 0, -1);
    }
    return g;
}

static void sgroup_free(ds41_sgroup *g) {
    for (int i = 0; i < g->n_seq; i++) {
        ds41_sseq *q = &g->seq[i];
        ds41_lproc_free(&q->proc);
        free(q->prompt); free(q->ids); free(q->lp); free(q->top_id); free(q->top_lp); free(q->off); free(q->text);
        free(q->img_at); free(q->img_key); free(q->img_emb);
    }
    for (int i = 0; i < g->n_img; i++) free(g->img[i]);
    free(g->img);
    free(g->img_len);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->stop_ids);
    ds41_gmatch_free(g->gm);
    ds41_grammar_free(g->grammar);
    ds41_gentry_release(g->gent);
    free(g->seq);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

void ds41_sgroup_release(ds41_sgroup *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left == 0) sgroup_free(g);
}

/* Hands the masks the step's constrained rows will sample from to the helper, which computes
 * them while the forward runs: a decode row's state, and in a verify row the states after each
 * of its drafts (ids[1..n), which valid_prefix walked already); a prefill row that ends its
 * prompt samples the first token from the grammar's start state. Returns how many (0: none, or
 * no helper). */
static int prefetch_masks(ds41_sched *S, ds41_sseq *const *bq, const ds41_batch_item *items, int nb) {
    int n = 0, cap = S->p.parallel * (S->B + 2);
    for (int i = 0; i < nb; i++) {
        const ds41_lproc *lp = &bq[i]->proc;
        int first = bq[i]->state == DS41_SEQ_PREFILL && items[i].ahead == 0 && bq[i]->max_tokens != 0;
        if ((bq[i]->state != DS41_SEQ_DECODE && !first) || !lp->gm || lp->gstate < 0 || (lp->gate >= 0 && !lp->gate_open))
            continue;
        if (!S->pf_tried) {
            S->pf_tried = 1;
            S->pf_gm = malloc((size_t)cap * sizeof *S->pf_gm);
            S->pf_state = malloc((size_t)cap * sizeof *S->pf_state);
            if (S->pf_gm && S->pf_state) __atomic_store_n(&S->pf, ds41_gprefetch_start(), __ATOMIC_RELEASE);
        }
        if (!S->pf) break;
        int st = lp->gstate;
        for (size_t j = 0; st >= 0 && n < cap; j++) {
            S->pf_gm[n] = lp->gm;
            S->pf_state[n++] = st;
            if (!items[i].verify || j + 1 >= items[i].n) break;
            st = ds41_gmatch_advance(lp->gm, st, items[i].ids[j + 1]);
        }
    }
    return n && S->pf ? ds41_gprefetch_submit(S->pf, S->pf_gm, S->pf_state, n) : 0;
}

/* ---------------------------------------------------------------- budget */

long long ds41_sched_reserve_bytes(const ds41_sched *S, size_t n_prompt, long long max_tokens) {
    long long t = (long long)n_prompt + (max_tokens > 0 ? max_tokens : 0);
    if (t > S->ctx) t = S->ctx;
    long long pages = (t + 127) / 128;
    return S->p.bounded_bytes + (long long)ceil(S->p.kv_per_token * 128.0) * pages;
}

/* ---------------------------------------------------------------- submit / cancel */

int ds41_sched_submit(ds41_sched *S, ds41_sgroup *g, int *status) {
    pthread_mutex_lock(&S->mu);
    if (S->stopping) { pthread_mutex_unlock(&S->mu); *status = 503; return -1; }
    if (S->q_len + g->n_seq > S->p.max_queue) { pthread_mutex_unlock(&S->mu); *status = 429; return -1; }
    pthread_mutex_lock(&g->mu);
    g->refs += g->n_seq;   /* one per sequence, dropped as each leaves the scheduler */
    pthread_mutex_unlock(&g->mu);
    g->t_arrival = now_s();
    for (int i = 0; i < g->n_seq; i++) {
        ds41_sseq *q = &g->seq[i];
        q->state = DS41_SEQ_WAITING;
        /* an image's span is longer than its placeholder: img_extra counts it from admission */
        q->reserve = ds41_sched_reserve_bytes(S, q->n_prompt + (size_t)g->img_extra, q->max_tokens);
        S->q[(S->q_head + S->q_len++) % S->p.max_queue] = q;
    }
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    return 0;
}

void ds41_sched_cancel(ds41_sched *S, ds41_sgroup *g) {
    atomic_store(&g->cancel, 1);
    pthread_mutex_lock(&S->mu);
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
}

void ds41_sched_gauges(ds41_sched *S, ds41_gauges *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&S->mu);
    o->running = S->n_run;
    o->waiting = S->q_len;
    o->sessions_open = S->sessions_open;
    o->kv_budget = S->p.kv_budget;
    if (S->p.pc) {
        ds41_prefix_stats ps;
        ds41_prefix_get_stats(S->p.pc, &ps);
        o->prefix_bytes = ps.bytes;
    }
    o->kv_reserved = S->kv_reserved;
    o->kv_used = S->kv_used;
    pthread_mutex_unlock(&S->mu);
    if (S->p.vcache) {
        o->vision = 1;
        ds41_vcache_get_stats(S->p.vcache, &o->vc);
    }
    ds41_gprefetch *pf = __atomic_load_n(&S->pf, __ATOMIC_ACQUIRE);   /* set once, on the scheduler thread */
    o->gt_prefetched = pf ? ds41_gprefetch_count(pf) : 0;
}

/* ---------------------------------------------------------------- finishing */

/* Marks q finished (group mutex) and closes its session. Called on the scheduler thread
 * without S->mu. The scheduler holds one group reference per sequence and drops it only when
 * the sequence leaves its lists (seq_release), so q stays valid until then. */
/* Publishes the whole blocks of what q's session holds: the prompt, then the generated ids. */
static void seq_publish(ds41_sched *S, ds41_sseq *q, int with_generated) {
    if (!S->p.pc || !q->s) return;
    /* image positions are keyed on their image's content (the mirror's ranks hold the keys:
     * ds41_smirror_images) */
    if (q->g->n_img && !q->img_key) return;
    size_t n = q->n_prompt, extra = with_generated ? q->n_ids : 0;
    if ((n + extra) / 128 <= n / 128 && with_generated) return;   /* no new whole block */
    int32_t *t = malloc((n + extra + 1) * sizeof *t);
    if (!t) return;
    memcpy(t, q->prompt, n * sizeof *t);
    pthread_mutex_lock(&q->g->mu);
    if (extra) memcpy(t + n, q->ids, extra * sizeof *t);
    pthread_mutex_unlock(&q->g->mu);
    ds41_prefix_img pim = { q->img_at, q->img_key, NULL, n };
    /* under --dp-attention only the owner publishes */
    if (ds41_smirror_publish(S->p.mirror, q->s, t, n + extra))
        ds41_prefix_publish_img(S->p.pc, q->s, t, n + extra, q->g->n_img ? &pim : NULL);
    free(t);
}

static void seq_finish(ds41_sched *S, ds41_sseq *q, int reason, const char *err) {
    ds41_sgroup *g = q->g;
    double t = now_s();
    if (q->vjob) {
        /* its thread reads the group's image bytes: it ends before the sequence does (a
         * cancelled encode costs the scheduler the rest of that one encode) */
        ds41_cli_vimage *im = NULL;
        if (!ds41_vjob_finish(q->vjob, &im, NULL, 0)) {
            for (int k = 0; k < g->n_img; k++) ds41_cli_image_free(&im[k]);
            free(im);
        }
        q->vjob = NULL;
    }
    if (q->s && (reason == DS41_FIN_STOP || reason == DS41_FIN_LENGTH)) seq_publish(S, q, 1);
    if (q->s) {
        ds41_smirror_close(S->p.mirror, q->s);
        ds41_session_close(q->s);
        q->s = NULL;
        pthread_mutex_lock(&S->mu);
        S->sessions_open--;
        pthread_mutex_unlock(&S->mu);
    }
    ds41_metrics *m = S->m;
    pthread_mutex_lock(&m->mu);
    m->finished[reason]++;
    pthread_mutex_unlock(&m->mu);
    if (reason != DS41_FIN_ABORT && reason != DS41_FIN_ERROR) {
        ds41_metrics_observe(m, &m->e2e, t - g->t_arrival);
        ds41_metrics_observe(m, &m->gen_len, (double)q->n_ids);
        ds41_metrics_observe(m, &m->prompt_len, (double)q->n_prompt);
        if (q->t_first > 0) ds41_metrics_observe(m, &m->decode, t - q->t_first);
    }
    q->state = DS41_SEQ_DONE;
    pthread_mutex_lock(&g->mu);
    q->finished = 1;
    q->finish = reason;
    if (err) snprintf(q->err, sizeof q->err, "%s", err);
    g->n_finished++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void seq_release(ds41_sseq *q) { ds41_sgroup_release(q->g); }

/* ---------------------------------------------------------------- one token */

static int grow(ds41_sseq *q) {
    if (q->n_ids < q->cap_ids) return 0;
    size_t nc = q->cap_ids ? q->cap_ids * 2 : 64;
    int32_t *ids = realloc(q->ids, nc * sizeof *ids);
    if (!ids) return -1;
    q->ids = ids;
    size_t *off = realloc(q->off, nc * sizeof *off);
    if (!off) return -1;
    q->off = off;
    if (q->n_top >= 0) {
        float *lp = realloc(q->lp, nc * sizeof *lp);
        if (!lp) return -1;
        q->lp = lp;
        size_t k = (size_t)(q->n_top > 0 ? q->n_top : 1);
        int32_t *ti = realloc(q->top_id, nc * k * sizeof *ti);
        if (!ti) return -1;
        q->top_id = ti;
        float *tl = realloc(q->top_lp, nc * k * sizeof *tl);
        if (!tl) return -1;
        q->top_lp = tl;
    }
    q->cap_ids = nc;
    return 0;
}

static int text_add(ds41_sseq *q, const char *p, size_t n) {
    if (q->text_len + n + 1 > q->text_cap) {
        size_t nc = (q->text_cap ? q->text_cap * 2 : 256) + n;
        char *t = realloc(q->text, nc);
        if (!t) return -1;
        q->text = t;
        q->text_cap = nc;
    }
    memcpy(q->text + q->text_len, p, n);
    q->text_len += n;
    q->text[q->text_len] = 0;
    return 0;
}

void ds41_sched_logprobs(const float *lg, int V, int32_t id, int n_top, float *lp, int32_t *top_id, float *top_lp) {
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) if (lg[i] > mx) mx = lg[i];
    double se = 0;
    for (int i = 0; i < V; i++) se += exp((double)lg[i] - mx);
    double lse = mx + log(se);
    *lp = (float)((double)lg[id] - lse);
    int nb = 0;
    for (int i = 0; i < V && n_top > 0; i++) {
        if (nb == n_top && !(lg[i] > lg[top_id[n_top - 1]])) continue;
        int j = nb < n_top ? nb++ : n_top - 1;
        while (j > 0 && lg[i] > lg[top_id[j - 1]]) { top_id[j] = top_id[j - 1]; j--; }
        top_id[j] = i;
    }
    for (int i = 0; i < nb; i++) top_lp[i] = (float)((double)lg[top_id[i]] - lse);
    for (int i = nb; i < n_top; i++) { top_id[i] = 0; top_lp[i] = -INFINITY; }
}

/* Records q's next token id, drawn from the logits row lg, and applies the stop conditions;
 * pos: the tokens the session holds when id is next in plain decoding (the context check).
 * Returns 1 when q finished. */
static int seq_emit(ds41_sched *S, ds41_sseq *q, int32_t id, const float *lg, long long pos, double t) {
    ds41_sgroup *g = q->g;
    if (id < 0 || id >= S->V) { seq_finish(S, q, DS41_FIN_ERROR, "sampling failed"); return 1; }
    ds41_lproc_accept(&q->proc, id);
    if (q->proc.err[0]) { seq_finish(S, q, DS41_FIN_ERROR, q->proc.err); return 1; }
    int is_eos = !g->ignore_eos && id == S->eos && S->eos >= 0;
    for (size_t i = 0; i < g->n_stop_ids && !is_eos; i++) is_eos = id == g->stop_ids[i];
    size_t pl = 0;
    if (S->tok && !is_eos) pl = ds41_detok_stream_push(&q->ds, id, S->piece, S->piece_cap);
    ds41_metrics *m = S->m;
    if (q->t_first == 0) {
        q->t_first = t;
        ds41_metrics_observe(m, &m->ttft, t - g->t_arrival);
        ds41_metrics_observe(m, &m->prefill, t - q->t_admit);
    } else {
        ds41_metrics_observe(m, &m->itl, t - q->t_last);
    }
    q->t_last = t;
    pthread_mutex_lock(&m->mu);
    m->generation_tokens++;
    pthread_mutex_unlock(&m->mu);
    int reason = -1;
    pthread_mutex_lock(&g->mu);
    int oom = grow(q);
    if (!oom) {
        size_t k = (size_t)(q->n_top > 0 ? q->n_top : 0);
        if (q->n_top >= 0 &&   /* computed by the rank that sampled it, or here from the row */
            !ds41_smirror_logprobs(S->p.mirror, q->s, q->n_top, &q->lp[q->n_ids], q->top_id + q->n_ids * k, q->top_lp + q->n_ids * k))
            ds41_sched_logprobs(lg, S->V, id, q->n_top, &q->lp[q->n_ids], q->top_id + q->n_ids * k, q->top_lp + q->n_ids * k);
        q->off[q->n_ids] = q->text_len;
        q->ids[q->n_ids++] = id;
        size_t before = q->text_len;
        oom = text_add(q, S->piece, pl);
        if (!oom && (is_eos || (long long)q->n_ids >= q->max_tokens || pos >= S->ctx)) {
            /* the text held back by the stream decoder is final now */
            size_t fl = S->tok && !is_eos ? ds41_detok_stream_flush(&q->ds, S->piece, S->piece_cap) : 0;
            oom = text_add(q, S->piece, fl);
            reason = is_eos ? DS41_FIN_STOP : DS41_FIN_LENGTH;
        }
        /* stop strings: the earliest match in the text that could have changed */
        size_t from = before > g->stop_hold ? before - g->stop_hold : 0, best = (size_t)-1;
        for (int i = 0; i < g->n_stop && !oom; i++) {
            const char *hit = memmem(q->text + from, q->text_len - from, g->stop[i], strlen(g->stop[i]));
            if (hit && (size_t)(hit - q->text) < best) { best = (size_t)(hit - q->text); q->stop_hit = i + 1; }
        }
        if (best != (size_t)-1) {
            q->text_len = best;
            q->text[best] = 0;
            reason = DS41_FIN_STOP;
        }
        /* parallel_tool_calls false: the first invoke that closes ends the reply (the parser
         * keeps a block's finished calls) */
        static const char iclose[] = "</\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke>";
        if (g->one_call && reason < 0 && !oom) {
            size_t f2 = before > sizeof iclose ? before - sizeof iclose : 0;
            if (memmem(q->text + f2, q->text_len - f2, iclose, sizeof iclose - 1)) reason = DS41_FIN_STOP;
        }
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (oom) { seq_finish(S, q, DS41_FIN_ERROR, "out of memory"); return 1; }
    if (reason >= 0) { seq_finish(S, q, reason, NULL); return 1; }
    q->next = id;
    q->state = DS41_SEQ_DECODE;
    return 0;
}

/* Samples q's next token from its fresh logits (its own random stream) and records it. */
static int seq_token(ds41_sched *S, ds41_sseq *q, double t) {
    return seq_emit(S, q, ds41_session_sample(q->s), ds41_logits(q->s), ds41_session_pos(q->s), t);
}

/* ---------------------------------------------------------------- speculative decoding */

/* The curve of --spec auto: the cache file, else measured now (on the scheduler thread,
 * before the first step: requests wait in the queue meanwhile) and saved. */
static void spec_curve_init(ds41_sched *S) {
    if (S->p.curve_path[0] && ds41_spec_curve_load(S->p.curve_path, &S->curve) == 0) return;
    char eb[512];
    double t0 = now_s();
    /* its forwards are collective under mpiexec */
    if (ds41_smirror_calibrate(S->p.mirror, S->e, S->B + 1, 32, 3, &S->curve, eb, sizeof eb)) {
        fprintf(stderr, "ds41 serve: speculative calibration failed (%s): drafts scheduled by expected tokens only\n", eb);
        memset(&S->curve, 0, sizeof S->curve);
        return;
    }
    int saved = S->p.curve_path[0] && ds41_spec_curve_save(S->p.curve_path, &S->curve) == 0;
    if (saved) ds41_spec_curve_load(S->p.curve_path, &S->curve);
    fprintf(stderr, "ds41 serve: measured the verify-width curve in %.2f s (widths 1..%d)%s%s\n", now_s() - t0,
            S->curve.n, saved ? ", cached in " : "", saved ? S->p.curve_path : "");
}

/* The step's cost model for R greedy sequences verifying together: ds41_batch_step runs all
 * their rows in one forward (weights read once per step), so a step of total width w = R +
 * drafts costs about what one verify block of width w costs: t(w) from the measured curve,
 * linear past its last width (ds41_spec_curve_sps). */
static int batch_curve(const ds41_spec_curve *c, int R, int B, ds41_spec_curve *o) {
    if (!c || c->n < 1) return -1;
    int n = R * (B + 1);
    if (n > DS41_SPEC_MAX_WIDTH) n = DS41_SPEC_MAX_WIDTH;
    if (n < 2) n = 2;
    memset(o, 0, sizeof *o);
    for (int w = 1; w <= n; w++) o->sps[w] = ds41_spec_curve_sps(c, w);
    o->n = n;
    o->propose_s = c->propose_s;   /* each drafting sequence's proposal, each draft's head pass */
    o->draft_s = c->draft_s;
    return 0;
}

/* Draft lengths of the decode rows dq[0..R): kmax per row (0: a plain decode row), the
 * proposals in S->vblk / S->conf by batch slot; fills len. budget: the step's tokens. */
static void spec_plan(ds41_sched *S, ds41_sseq **dq, int R, const int *kmax, int *len, long long budget) {
    int B = S->B;
    for (int r = 0; r < R; r++) len[r] = 0;
    if (S->p.spec_mode == DS41_SPEC_FIXED) {
        for (int r = 0; r < R; r++) len[r] = S->p.spec_k < kmax[r] ? S->p.spec_k : kmax[r];
        return;
    }
    /* sampled sequences alone over the measured curve (as ds41 run --spec auto) */
    int ng = 0;
    int *gi = malloc((size_t)(R ? R : 1) * sizeof *gi), *gm = malloc((size_t)(R ? R : 1) * sizeof *gm),
        *gl = malloc((size_t)(R ? R : 1) * sizeof *gl);
    float *gc = malloc((size_t)(R ? R : 1) * (B ? B : 1) * sizeof *gc);
    if (!gi || !gm || !gl || !gc) { free(gi); free(gm); free(gl); free(gc); return; }
    const ds41_spec_curve *cv = S->curve.n > 0 ? &S->curve : NULL;
    for (int r = 0; r < R; r++) {
        if (kmax[r] <= 0) continue;
        if (dq[r]->temperature > 0.0f) {
            ds41_spec_schedule(cv, 1, B, S->conf + (size_t)r * B, &kmax[r], &len[r]);
        } else {
            memcpy(gc + (size_t)ng * B, S->conf + (size_t)r * B, (size_t)B * sizeof(float));
            gm[ng] = kmax[r];
            gi[ng++] = r;
        }
    }
    /* the greedy ones together (spec 5.4 across the batch) */
    if (ng > 0) {
        ds41_spec_curve bc;
        ds41_spec_schedule(batch_curve(cv, ng, B, &bc) == 0 ? &bc : NULL, ng, B, gc, gm, gl);
        /* within the step's token budget: the longest greedy blocks give way first */
        long long w = R;
        for (int r = 0; r < R; r++) w += len[r];
        for (int i = 0; i < ng; i++) w += gl[i];
        while (w > budget) {
            int best = -1;
            for (int i = 0; i < ng; i++) if (gl[i] > 0 && (best < 0 || gl[i] > gl[best])) best = i;
            if (best < 0) break;
            gl[best]--;
            w--;
        }
        for (int i = 0; i < ng; i++) len[gi[i]] = gl[i];
    }
    free(gi); free(gm); free(gl); free(gc);
}

/* ---------------------------------------------------------------- the loop */

static int admit_prefix(ds41_sched *S, ds41_sseq *q);
static int seq_admitted(ds41_sched *S, ds41_sseq *q, long long hit);

/* The group's images, encoded by q's job (which ends here), expanded into q's prompt at each
 * placeholder id (q->prompt becomes the expanded ids); the image flags, content keys and
 * embeddings kept in q (img_at, img_key, img_emb) for the prefill steps and the prefix cache. */
static int expand_images(ds41_sched *S, ds41_sseq *q) {
    ds41_cli_vprompt vpx = { 0 }, *vp = &vpx;
    ds41_sgroup *g = q->g;
    ds41_cli_vimage *im = NULL;
    char msg[512] = "out of memory";
    ds41_err err = { 0 };
    int rc = ds41_vjob_finish(q->vjob, &im, msg, sizeof msg);
    q->vjob = NULL;
    if (!rc && ds41_cli_vprompt_ids(vp, q->prompt, q->n_prompt, im, g->n_img, ds41_model_dim(S->e),
                                    ds41_image_token_id(S->e), &err)) {
        snprintf(msg, sizeof msg, "%.500s", err.msg);
        rc = -1;
    }
    for (int i = 0; im && i < g->n_img; i++) ds41_cli_image_free(&im[i]);
    free(im);
    if (!rc && vp->is_image) {
        /* the prompt's image rows, for the prefill steps and the prefix cache */
        q->img_at = vp->is_image;
        q->img_key = vp->key;
        q->img_emb = vp->emb;
        vp->is_image = vp->key = NULL;
        vp->emb = NULL;
    }
    if (rc) {
        ds41_cli_vprompt_free(vp);
        seq_finish(S, q, DS41_FIN_ERROR, msg);
        return -1;
    }
    pthread_mutex_lock(&g->mu);
    g->img_extra = (long long)vp->n - (long long)q->n_prompt;
    pthread_mutex_unlock(&g->mu);
    free(q->prompt);
    q->prompt = vp->ids;
    q->n_prompt = vp->n;
    vp->ids = NULL;
    ds41_cli_vprompt_free(vp);
    return 0;
}

static int session_ready(ds41_sched *S, ds41_sseq *q);

static int open_session(ds41_sched *S, ds41_sseq *q) {
    char eb[512];
    q->s = ds41_session_open(S->e, &S->p.sp, eb, sizeof eb);
    if (!q->s) { seq_finish(S, q, DS41_FIN_ERROR, eb); return -1; }
    if (q->g->n_img) {
        /* the tower off the scheduler thread: the sequence waits in DS41_SEQ_IMAGE */
        q->vjob = ds41_vjob_start(S->e, S->p.vcache, q->g->img, q->g->img_len, q->g->n_img);
        if (!q->vjob) { seq_finish(S, q, DS41_FIN_ERROR, "out of memory"); return -1; }
        q->state = DS41_SEQ_IMAGE;
        return 0;
    }
    return session_ready(S, q);
}

/* q's session is open and its images (if any) encoded: the rest of the admission. */
static int session_ready(ds41_sched *S, ds41_sseq *q) {
    if (q->g->n_img && expand_images(S, q)) return -1;
    int dim = ds41_model_dim(S->e);
    ds41_prefix_img pim = { q->img_at, q->img_key, q->img_emb, q->n_prompt };
    ds41_smirror_route(S->p.mirror, S->p.pc, q->prompt, q->n_prompt, q->img_at ? &pim : NULL);
    /* under --dp-attention with --spec: a sequence rank 0 samples stays there (serve_mpi.h): one
     * with more logprobs than the owner sends; a logits processor goes to its owner, which
     * decides the verify with it (a grammar's allowed tokens per verify row from here, VMASK) */
    ds41_smirror_open(S->p.mirror, q->s, S->B > 0 && S->p.spec_mode != DS41_SPEC_OFF && q->n_top > DS41_REQ_MAX_TOP_LOGPROBS);
    /* the other ranks keep the prompt's image rows for its restore, steps and publishes */
    if (q->img_at) ds41_smirror_images(S->p.mirror, q->s, &pim, dim);
    pthread_mutex_lock(&S->mu);
    S->sessions_open++;
    pthread_mutex_unlock(&S->mu);
    ds41_session_set_sampling(q->s, q->temperature, q->top_k, q->top_p, q->min_p, q->seed);
    if (ds41_lproc_active(&q->proc) &&
        (ds41_lproc_ready(&q->proc) || ds41_lproc_prompt(&q->proc, q->prompt, q->n_prompt) || ds41_session_set_lproc(q->s, &q->proc))) {
        seq_finish(S, q, DS41_FIN_ERROR, "out of memory");
        return -1;
    }
    /* under --dp-attention the owner samples, with the processor (a grammar's allowed tokens
     * from here, GMASK) */
    ds41_smirror_sampling(S->p.mirror, q->s, q->temperature, q->top_k, q->top_p, q->min_p, q->seed, q->n_top, &q->proc);
    if (S->tok) {
        ds41_detok_stream_init(&q->ds, S->tok);
        q->ds.skip_special = q->g->skip_special;
    }
    q->fed = 0;
    q->state = DS41_SEQ_PREFILL;
    if (q->g->n_img) {
        /* the prefix cache keys image positions on the images' content; the rest of the
         * prompt prefills in the steps, its image rows with their embeddings */
        return seq_admitted(S, q, S->p.pc ? ds41_smirror_restore(S->p.mirror, S->e, S->p.pc, q->s, q->prompt, q->n_prompt,
                                                                 q->img_at ? &pim : NULL)
                                          : 0);
    }
    if (S->p.remote.start && S->p.pc) {
        /* worth a prefill node: enough new tokens past the local hit, a whole block to fetch */
        uint8_t **pg = NULL;
        long long hb;
        if (S->p.mirror) {
            /* under mpiexec a query that moves nothing: the other ranks' caches do not see it
             * (neither the LRU order nor blocks read from rank 0's store); under --dp-attention
             * the owner's answer to the PROBE that routed the prompt */
            hb = ds41_smirror_held(S->p.mirror, S->p.pc, q->s, q->prompt, q->n_prompt);
        } else {
            hb = ds41_prefix_pages(S->p.pc, q->prompt, q->n_prompt, &pg);
            ds41_prefix_pages_free(S->p.pc, pg, hb);
        }
        /* whole blocks short of the last token: the decode node's tail forward gives its logits */
        long long nb = ((long long)q->n_prompt - 1) / 128;
        if (nb * 128 > S->ctx) nb = S->ctx / 128;
        if ((long long)q->n_prompt - hb * 128 >= S->p.remote.min_tokens && nb > hb) {
            q->rjob = S->p.remote.start(S->p.remote.ctx, q->s, q->prompt, q->n_prompt, (size_t)(nb * 128), hb);
            if (q->rjob) { q->state = DS41_SEQ_REMOTE; q->local_hit = hb * 128; return 0; }
        }
    }
    return admit_prefix(S, q);
}

/* The prefix-cache restore of q's prompt, also after a remote prefill filled the cache. */
static int admit_prefix(ds41_sched *S, ds41_sseq *q) {
    return seq_admitted(S, q, S->p.pc ? ds41_smirror_restore(S->p.mirror, S->e, S->p.pc, q->s, q->prompt, q->n_prompt, NULL) : 0);
}

/* q's session holds the first `hit` prompt tokens (a prefix-cache restore; -1: it failed):
 * the rest is prefilled by the steps, or the first token comes now. */
static int seq_admitted(ds41_sched *S, ds41_sseq *q, long long hit) {
    q->state = DS41_SEQ_PREFILL;
    if (!S->p.pc) return 0;
    if (hit < 0) { seq_finish(S, q, DS41_FIN_ERROR, ds41_session_error(q->s)); return -1; }
    pthread_mutex_lock(&S->m->mu);
    S->m->prefix_queries += q->n_prompt;
    S->m->prefix_hits += (unsigned long long)hit;
    S->m->prompt_tokens += (unsigned long long)hit;
    pthread_mutex_unlock(&S->m->mu);
    q->fed = (size_t)hit;
    pthread_mutex_lock(&q->g->mu);
    q->cached = hit;
    pthread_mutex_unlock(&q->g->mu);
    if (q->fed == q->n_prompt) {
        /* the whole prompt was cached: its logits are there, the first token now */
        if (q->max_tokens == 0) { seq_finish(S, q, DS41_FIN_LENGTH, NULL); return 0; }
        seq_token(S, q, now_s());
    }
    return 0;
}

/* After a step's forwards (its logits here): the metrics, then per item its error, the
 * prompt fed, the verify's outcome or the next token. */
static void step_done(ds41_sched *S, ds41_sseq *const *bq, const ds41_batch_item *items, const long long *pos0, int nb) {
    double t1 = now_s();
    long long ntok = 0;
    for (int i = 0; i < nb; i++) ntok += (long long)items[i].n;
    ds41_metrics_observe(S->m, &S->m->iter_tokens, (double)ntok);
    pthread_mutex_lock(&S->m->mu);
    S->m->steps++;
    pthread_mutex_unlock(&S->m->mu);
    for (int i = 0; i < nb; i++) {
        ds41_sseq *q = bq[i];
        const char *err = ds41_session_error(q->s);
        if (err && err[0]) { seq_finish(S, q, DS41_FIN_ERROR, err); continue; }
        if (q->state == DS41_SEQ_PREFILL) {
            q->fed += items[i].n;
            pthread_mutex_lock(&S->m->mu);
            S->m->prompt_tokens += items[i].n;
            pthread_mutex_unlock(&S->m->mu);
            if (q->fed < q->n_prompt) continue;
            free(q->img_emb);   /* the prompt is in: its embeddings are not read again */
            q->img_emb = NULL;
            seq_publish(S, q, 0);
            if (q->max_tokens == 0) { seq_finish(S, q, DS41_FIN_LENGTH, NULL); continue; }
        } else if (items[i].verify) {
            const ds41_batch_item *b = &items[i];
            int K = (int)b->n - 1, A = b->n_accepted;
            pthread_mutex_lock(&S->m->mu);
            S->m->spec_verify_steps++;
            if (K > 0) S->m->spec_drafts++;
            S->m->spec_draft_tokens += (unsigned long long)K;
            S->m->spec_accepted_tokens += (unsigned long long)A;
            for (int j = 0; j < K && j < 64; j++) S->m->spec_drafted_at[j]++;
            for (int j = 0; j < A && j < 64; j++) S->m->spec_accepted_at[j]++;
            pthread_mutex_unlock(&S->m->mu);
            /* out[j] is the token after position pos0 + j: plain decoding would hold
             * pos0 + 1 + j tokens when it is next */
            for (int j = 0; j < b->n_out; j++)
                if (seq_emit(S, q, b->out[j], b->out_logits ? b->out_logits + (size_t)j * S->V : NULL,
                             pos0[i] + 1 + j, t1))
                    break;
            continue;
        }
        seq_token(S, q, t1);
    }
}

/* Overlapped steps (--split layers, ds41_smirror_overlap): the step begun earlier (handle h)
 * collects its logits and samples; its sequences may run again. */
static void step_end(ds41_sched *S, ds41_sseq *const *bq, ds41_batch_item *items, const long long *pos0, int nb, int h) {
    ds41_smirror_batch_end(S->p.mirror, S->e, items, nb, h);
    for (int i = 0; i < nb; i++) bq[i]->in_flight = 0;
    step_done(S, bq, items, pos0, nb);
}

#define SWAP(T, a, b) do { T t_ = (a); (a) = (b); (b) = t_; } while (0)

static void *sched_main(void *arg) {
    ds41_sched *S = arg;
    int P = S->p.parallel;
    ds41_session **bs = calloc((size_t)P, sizeof *bs);
    const int32_t **bi = calloc((size_t)P, sizeof *bi);
    size_t *bn = calloc((size_t)P, sizeof *bn);
    ds41_sseq **bq = calloc((size_t)P, sizeof *bq), **admitted = calloc((size_t)P, sizeof *admitted);
    ds41_sseq **local = calloc((size_t)P, sizeof *local), **dropped = calloc((size_t)S->p.max_queue + 1, sizeof *dropped);
    ds41_batch_item *items = calloc((size_t)P, sizeof *items);
    int *kmax = calloc((size_t)P, sizeof *kmax), *len = calloc((size_t)P, sizeof *len);
    int *vrow = calloc((size_t)P, sizeof *vrow);   /* decode row r is a verify block */
    long long *pos0 = calloc((size_t)P, sizeof *pos0);
    /* --spec: the step's proposals (ds41_smirror_propose_all) */
    ds41_session **ps = calloc((size_t)P, sizeof *ps);
    int32_t *pt = calloc((size_t)P, sizeof *pt);
    int32_t **pids = calloc((size_t)P, sizeof *pids);
    float **pconf = calloc((size_t)P, sizeof *pconf);
    int *prc = calloc((size_t)P, sizeof *prc);
    if (!bs || !bi || !bn || !bq || !admitted || !local || !dropped || !items || !kmax || !len || !vrow || !pos0 || !ps || !pt ||
        !pids || !pconf || !prc)
        abort();
    int spec = S->p.spec_mode != DS41_SPEC_OFF && S->B > 0, W = S->B + 2;
    /* --split layers: one step in flight while the next one (the other sequences) begins, so
     * that the stages do not drain between steps; fly_*: the step in flight */
    int ov = !spec && ds41_smirror_overlap(S->p.mirror, S->e), fly_nb = 0, fly_h = 0;
    ds41_sseq **fly_bq = calloc((size_t)P, sizeof *fly_bq);
    ds41_batch_item *fly_items = calloc((size_t)P, sizeof *fly_items);
    long long *fly_pos0 = calloc((size_t)P, sizeof *fly_pos0);
    if (!fly_bq || !fly_items || !fly_pos0) abort();
    if (spec && S->p.spec_mode == DS41_SPEC_AUTO) spec_curve_init(S);
    for (;;) {
        /* ---- admission (S->mu) */
        int n_adm = 0, n_drop = 0, stop = 0;
        pthread_mutex_lock(&S->mu);
        while (!S->stopping && S->n_run == 0 && S->q_len == 0) {
            if (!S->p.mirror) { pthread_cond_wait(&S->cv, &S->mu); continue; }
            /* under mpiexec the other ranks hear from rank 0 while it idles (serve_mpi.h) */
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            double b = ds41_smirror_beat_s();
            dl.tv_sec += (time_t)b;
            dl.tv_nsec += (long)((b - (double)(time_t)b) * 1e9);
            if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&S->cv, &S->mu, &dl);
            /* not under S->mu: a lost rank seen here answers the requests (ds41_sched_fail_all) */
            pthread_mutex_unlock(&S->mu);
            ds41_smirror_beat(S->p.mirror);
            pthread_mutex_lock(&S->mu);
        }
        stop = S->stopping;
        while (S->q_len > 0) {
            ds41_sseq *q = S->q[S->q_head];
            if (!stop && !atomic_load(&q->g->cancel)) {
                if (S->n_run >= P) break;
                /* the prefix cache's blocks live in the same byte budget: when a sequence
                 * needs the room, least recently used blocks go first */
                long long held = 0;
                if (S->p.pc) {
                    ds41_prefix_stats ps;
                    ds41_prefix_get_stats(S->p.pc, &ps);
                    held = ps.bytes;
                }
                if (S->kv_reserved + q->reserve + held > S->p.kv_budget && held > 0) {
                    ds41_smirror_trim(S->p.mirror, S->p.kv_budget - S->kv_reserved - q->reserve);
                    held = ds41_prefix_trim(S->p.pc, S->p.kv_budget - S->kv_reserved - q->reserve);
                }
                if (S->kv_reserved + q->reserve + held > S->p.kv_budget) break;
                S->kv_reserved += q->reserve;
                S->run[S->n_run++] = q;
                admitted[n_adm++] = q;
            } else {
                dropped[n_drop++] = q;
            }
            S->q_head = (S->q_head + 1) % S->p.max_queue;
            S->q_len--;
        }
        int n_local = S->n_run;
        memcpy(local, S->run, (size_t)n_local * sizeof *local);
        pthread_mutex_unlock(&S->mu);

        double t = now_s();
        for (int i = 0; i < n_drop; i++) {
            seq_finish(S, dropped[i], DS41_FIN_ABORT, stop ? "server shutting down" : "cancelled");
            seq_release(dropped[i]);
        }
        for (int i = 0; i < n_adm; i++) {
            admitted[i]->t_admit = t;
            ds41_metrics_observe(S->m, &S->m->queue, t - admitted[i]->g->t_arrival);
            open_session(S, admitted[i]);
        }
        /* ---- images encoded off this thread: a sequence whose job ended enters prefill */
        int n_image = 0;
        for (int i = 0; i < n_local; i++) {
            ds41_sseq *q = local[i];
            if (q->state != DS41_SEQ_IMAGE) continue;
            if (stop || atomic_load(&q->g->cancel)) {
                seq_finish(S, q, DS41_FIN_ABORT, stop ? "server shutting down" : "cancelled");
                continue;
            }
            if (ds41_vjob_done(q->vjob)) session_ready(S, q);
            else n_image++;
        }
        /* ---- remote prefills (docs/pd.md): finished ones enter through the prefix cache */
        int n_remote = 0;
        for (int i = 0; i < n_local; i++) {
            ds41_sseq *q = local[i];
            if (q->state != DS41_SEQ_REMOTE) continue;
            if (stop || atomic_load(&q->g->cancel)) {
                S->p.remote.finish(q->rjob);   /* bounded by the prefill timeout */
                q->rjob = NULL;
                seq_finish(S, q, DS41_FIN_ABORT, stop ? "server shutting down" : "cancelled");
                continue;
            }
            long long bytes = 0, hit = 0;
            double secs = 0;
            char msg[512] = "";
            int st = S->p.remote.poll(q->rjob, &bytes, &secs, &hit, msg, sizeof msg);
            if (st == 0) { n_remote++; continue; }
            S->p.remote.finish(q->rjob);
            q->rjob = NULL;
            pthread_mutex_lock(&S->m->mu);
            if (st == 1) {
                S->m->remote_prefills++;
                S->m->kv_transfer_bytes += (unsigned long long)bytes;
            } else if (!S->p.remote.fail) {
                S->m->remote_fallbacks++;
            }
            pthread_mutex_unlock(&S->m->mu);
            if (st == 1) ds41_metrics_observe(S->m, &S->m->kv_transfer, secs);
            if (st < 0) {
                fprintf(stderr, "ds41 serve: %s; %s\n", msg, S->p.remote.fail ? "the request fails (--on-prefill-failure fail)"
                                                                              : "prefilling locally");
                if (S->p.remote.fail) {
                    char em[600];
                    snprintf(em, sizeof em, "remote prefill failed: %s", msg);
                    seq_finish(S, q, DS41_FIN_ERROR, em);
                    continue;
                }
            }
            /* usage's cached_tokens: what the local cache held before the prefill node filled it
             * (the remote rows were computed for this request, as a local prefill's are) */
            if (seq_admitted(S, q, hit) == 0 && hit > q->local_hit) {
                pthread_mutex_lock(&q->g->mu);
                q->cached = q->local_hit;
                pthread_mutex_unlock(&q->g->mu);
            }
        }
        /* ---- cancelled or stopping running sequences (one in flight once its step ended) */
        for (int i = 0; i < n_local; i++) {
            ds41_sseq *q = local[i];
            if (q->state != DS41_SEQ_DONE && !q->in_flight && (stop || atomic_load(&q->g->cancel)))
                seq_finish(S, q, DS41_FIN_ABORT, stop ? "server shutting down" : "cancelled");
        }
        /* ---- one batch under the token budget: decode rows (with --spec: verify blocks)
         * first, then prefill chunks */
        int nb = 0, most = P;
        long long budget = S->p.batch_tokens;
        if (ov && fly_nb == 0) {
            /* none in flight: half of the sequences that can run now, the rest in the next step */
            int ready = 0;
            for (int i = 0; i < n_local; i++) ready += local[i]->state == DS41_SEQ_DECODE || local[i]->state == DS41_SEQ_PREFILL;
            most = ready > 1 ? (ready + 1) / 2 : ready;
        }
        for (int i = 0; i < n_local && nb < most; i++) {
            ds41_sseq *q = local[i];
            if (q->state != DS41_SEQ_DECODE || q->in_flight) continue;
            bq[nb] = q; bs[nb] = q->s; bi[nb] = &q->next; bn[nb] = 1;
            kmax[nb] = 0;
            if (spec) {
                int32_t *blk = S->vblk + (size_t)nb * W;
                blk[0] = q->next;
                kmax[nb] = ds41_spec_max_drafts(q->s);
                /* fixed:K verifies at most K: the drafts past K are neither made nor read */
                if (S->p.spec_mode == DS41_SPEC_FIXED && kmax[nb] > S->p.spec_k) kmax[nb] = S->p.spec_k;
                /* auto: no proposal where the gate says drafting cannot pay */
                if (kmax[nb] > 0 && S->p.spec_mode == DS41_SPEC_AUTO && S->curve.n > 0 &&
                    !ds41_spec_want_draft(q->s, &S->curve))
                    kmax[nb] = 0;
            }
            nb++;
            budget--;
        }
        if (spec && nb > 0) {
            /* the rows' proposals, together: the followers propose too (replicated), or under
             * --dp-attention each owner its own, the ranks' proposals sharing the exchange's rounds */
            int np = 0;
            for (int r = 0; r < nb; r++) {
                if (kmax[r] <= 0) continue;
                ps[np] = bs[r];
                pt[np] = bq[r]->next;
                pids[np] = S->vblk + (size_t)r * W + 1;
                pconf[np] = S->conf + (size_t)r * S->B;
                np++;
            }
            if (np > 0)
                ds41_smirror_propose_all(S->p.mirror, S->e, np, ps, pt,
                                         S->p.spec_mode == DS41_SPEC_FIXED && S->p.spec_k < S->B ? S->p.spec_k : 0, pids,
                                         pconf, prc);
            /* a failed proposal ends its sequence; the rows after it move up */
            int k = 0;
            for (int r = 0, p = 0; r < nb; r++) {
                int failed = kmax[r] > 0 && prc[p++];
                if (failed) {
                    seq_finish(S, bq[r], DS41_FIN_ERROR, ds41_session_error(bq[r]->s));
                    budget++;
                    continue;
                }
                if (k != r) {
                    bq[k] = bq[r]; bs[k] = bs[r]; bn[k] = bn[r]; kmax[k] = kmax[r];
                    bi[k] = &bq[k]->next;
                    memcpy(S->vblk + (size_t)k * W, S->vblk + (size_t)r * W, (size_t)W * sizeof *S->vblk);
                    memcpy(S->conf + (size_t)k * S->B, S->conf + (size_t)r * S->B, (size_t)S->B * sizeof *S->conf);
                }
                /* drafts past the first one the grammar refuses cannot be accepted: not verified */
                if (kmax[k] > 0) kmax[k] = ds41_lproc_valid_prefix(&bq[k]->proc, S->vblk + (size_t)k * W + 1, kmax[k]);
                k++;
            }
            nb = k;
        }
        int n_dec = nb;
        if (spec && n_dec > 0) {
            spec_plan(S, bq, n_dec, kmax, len, budget + n_dec);
            for (int r = 0; r < n_dec; r++) {
                /* no drafts: a plain decode row (ds41_run's K = 0 step), without a verify's
                 * snapshot, rollback and ring writes; the same token (greedy, or the session's
                 * sampler over the same row) */
                vrow[r] = !(S->p.spec_mode == DS41_SPEC_AUTO && len[r] == 0);
                if (!vrow[r]) continue;
                bi[r] = S->vblk + (size_t)r * W;
                bn[r] = (size_t)(1 + len[r]);
                budget -= len[r];
            }
        }
        for (int i = 0; i < n_local && nb < most; i++) {
            ds41_sseq *q = local[i];
            if (q->state != DS41_SEQ_PREFILL || q->in_flight) continue;
            long long left = (long long)(q->n_prompt - q->fed), c = left < budget ? left : budget;
            if (c < left && c < S->p.min_chunk) {
                if (nb > 0) continue;
                c = left < S->p.min_chunk ? left : S->p.min_chunk;
            }
            if (c <= 0) continue;
            bq[nb] = q; bs[nb] = q->s; bi[nb] = q->prompt + q->fed; bn[nb] = (size_t)c; nb++;
            budget -= c;
        }
        if (nb > 0) {
            for (int i = 0; i < nb; i++) {
                ds41_batch_item *b = &items[i];
                memset(b, 0, sizeof *b);
                b->s = bs[i]; b->ids = bi[i]; b->n = bn[i];
                /* a prefill part: the rest of the prompt follows in later steps, so its CED row
                 * plan reaches from the prompt's end */
                if (bq[i]->state == DS41_SEQ_PREFILL) b->ahead = (size_t)(bq[i]->n_prompt - bq[i]->fed) - bn[i];
                if (bq[i]->state == DS41_SEQ_PREFILL && bq[i]->img_emb) {
                    /* an image prompt's chunk: its rows' embeddings */
                    b->is_image = bq[i]->img_at + bq[i]->fed;
                    b->emb = bq[i]->img_emb + bq[i]->fed * (size_t)ds41_model_dim(S->e);
                }
                if (spec && i < n_dec && vrow[i]) {
                    pos0[i] = ds41_session_pos(bs[i]);
                    b->verify = 1;
                    b->out = S->vout + (size_t)i * W;
                    if (bq[i]->n_top >= 0) {
                        if (!S->vlg[i]) S->vlg[i] = malloc((size_t)(S->B + 1) * S->V * sizeof(float));
                        if (!S->vlg[i]) abort();
                        b->out_logits = S->vlg[i];
                    }
                }
            }
            int npf = prefetch_masks(S, bq, items, nb);
            if (ov) {
                int h = ds41_smirror_batch_begin(S->p.mirror, S->e, items, nb);
                if (npf) ds41_gprefetch_wait(S->pf);
                for (int i = 0; i < nb; i++) bq[i]->in_flight = 1;
                /* the step before (the other sequences) samples now, while this one runs */
                if (fly_nb > 0) step_end(S, fly_bq, fly_items, fly_pos0, fly_nb, fly_h);
                SWAP(ds41_sseq **, bq, fly_bq);
                SWAP(ds41_batch_item *, items, fly_items);
                SWAP(long long *, pos0, fly_pos0);
                fly_nb = nb, fly_h = h;
            } else {
                ds41_smirror_batch_step(S->p.mirror, S->e, items, nb);
                if (npf) ds41_gprefetch_wait(S->pf);   /* before anything can free a matcher */
                step_done(S, bq, items, pos0, nb);
            }
        } else if (fly_nb > 0) {
            step_end(S, fly_bq, fly_items, fly_pos0, fly_nb, fly_h);   /* nothing else to run meanwhile */
            fly_nb = 0;
        }
        if (nb == 0 && n_remote + n_image > 0) {
            /* only remote prefills or image encodes in flight: look again soon (their threads
             * do not signal) */
            struct timespec ts = { 0, 2000000 };
            nanosleep(&ts, NULL);
        }
        /* ---- retire finished sequences, account the state held */
        long long used = 0;
        for (int i = 0; i < n_local; i++)
            if (local[i]->s) {
                ds41_state_info si;
                ds41_session_state(local[i]->s, &si);
                used += si.total_bytes;
            }
        int n_ret = 0;
        pthread_mutex_lock(&S->mu);
        int k = 0;
        for (int i = 0; i < S->n_run; i++) {
            if (S->run[i]->state == DS41_SEQ_DONE) { S->kv_reserved -= S->run[i]->reserve; admitted[n_ret++] = S->run[i]; }
            else S->run[k++] = S->run[i];
        }
        S->n_run = k;
        S->kv_used = used;
        int done = S->stopping && S->n_run == 0 && S->q_len == 0;
        pthread_mutex_unlock(&S->mu);
        for (int i = 0; i < n_ret; i++) seq_release(admitted[i]);
        if (done) break;
    }
    free(bs); free(bi); free(bn); free(bq); free(admitted); free(local); free(dropped);
    free(items); free(kmax); free(len); free(vrow); free(pos0);
    free(ps); free(pt); free(pids); free(pconf); free(prc);
    free(fly_bq); free(fly_items); free(fly_pos0);
    return NULL;
}

ds41_sched *ds41_sched_start(ds41_engine *e, const ds41_tokenizer *tok, const ds41_sched_params *p,
                             ds41_metrics *m, char *err, size_t errcap) {
    ds41_sched *S = calloc(1, sizeof *S);
    if (!S) { snprintf(err, errcap, "out of memory"); return NULL; }
    S->e = e;
    S->tok = tok;
    S->p = *p;
    if (S->p.parallel < 1) S->p.parallel = 1;
    if (S->p.max_queue < 1) S->p.max_queue = 1;
    if (S->p.batch_tokens < 1) S->p.batch_tokens = 1;
    S->m = m;
    S->V = ds41_vocab_size(e);
    S->ctx = ds41_ctx_size(e);
    S->eos = tok ? ds41_tokenizer_eos(tok) : -1;
    S->q = calloc((size_t)S->p.max_queue, sizeof *S->q);
    S->run = calloc((size_t)S->p.parallel, sizeof *S->run);
    S->piece_cap = tok ? ds41_detok_stream_cap(tok) : 16;
    S->piece = malloc(S->piece_cap);
    S->B = ds41_draft_block_size(e);
    if (S->p.spec_mode != DS41_SPEC_OFF && S->B > 0) {
        S->p.sp.draft = 1;
        size_t W = (size_t)S->B + 2;
        S->vblk = malloc((size_t)S->p.parallel * W * sizeof *S->vblk);
        S->vout = malloc((size_t)S->p.parallel * W * sizeof *S->vout);
        S->conf = malloc((size_t)S->p.parallel * S->B * sizeof *S->conf);
        S->vlg = calloc((size_t)S->p.parallel, sizeof *S->vlg);
        if (!S->vblk || !S->vout || !S->conf || !S->vlg) {
            snprintf(err, errcap, "out of memory");
            free(S->vblk); free(S->vout); free(S->conf); free(S->vlg); free(S->q); free(S->run); free(S->piece); free(S);
            return NULL;
        }
        m->spec_positions = S->B;
    } else {
        S->p.spec_mode = DS41_SPEC_OFF;
    }
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    if (!S->q || !S->run || !S->piece || pthread_create(&S->th, NULL, sched_main, S)) {
        snprintf(err, errcap, "cannot start the scheduler");
        free(S->q); free(S->run); free(S->piece); free(S);
        return NULL;
    }
    return S;
}

void ds41_sched_stop(ds41_sched *S) {
    if (!S) return;
    pthread_mutex_lock(&S->mu);
    S->stopping = 1;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    pthread_join(S->th, NULL);
}

void ds41_sched_fail_all(ds41_sched *S, const char *msg, double wait_s) {
    /* no scheduler call may run after this (the caller is inside one, on the scheduler
     * thread): the sequences are marked here, their sessions stay as they are */
    pthread_mutex_lock(&S->mu);
    S->stopping = 1;
    int n = S->n_run + S->q_len;
    ds41_sseq **all = malloc((size_t)(n ? n : 1) * sizeof *all);
    int k = 0;
    for (int i = 0; all && i < S->n_run; i++) all[k++] = S->run[i];
    for (int i = 0; all && i < S->q_len; i++) all[k++] = S->q[(S->q_head + i) % S->p.max_queue];
    pthread_mutex_unlock(&S->mu);
    if (!all) return;
    for (int i = 0; i < k; i++) {
        ds41_sgroup *g = all[i]->g;
        pthread_mutex_lock(&g->mu);
        if (!all[i]->finished) {
            all[i]->finished = 1;
            all[i]->finish = DS41_FIN_ABORT;
            snprintf(all[i]->err, sizeof all[i]->err, "%s", msg);
            g->n_finished++;
            pthread_cond_broadcast(&g->cv);
        }
        pthread_mutex_unlock(&g->mu);
    }
    /* until each request's handler let go of its group (its answer is out): the scheduler
     * holds one reference per sequence of the group in its lists */
    double t0 = now_s();
    for (int i = 0; i < k; i++) {
        ds41_sgroup *g = all[i]->g;
        int held = 0;
        for (int j = 0; j < k; j++) held += all[j]->g == g;
        for (;;) {
            pthread_mutex_lock(&g->mu);
            int refs = g->refs;
            pthread_mutex_unlock(&g->mu);
            if (refs <= held || now_s() - t0 > wait_s) break;
            struct timespec ts = { 0, 10000000 };
            nanosleep(&ts, NULL);
        }
    }
    free(all);
}

void ds41_sched_free(ds41_sched *S) {
    if (!S) return;
    pthread_mutex_destroy(&S->mu);
    pthread_cond_destroy(&S->cv);
    free(S->q); free(S->run); free(S->piece);
    if (S->vlg)
        for (int i = 0; i < S->p.parallel; i++) free(S->vlg[i]);
    free(S->vblk); free(S->vout); free(S->conf); free(S->vlg);
    ds41_gprefetch_stop(S->pf);
    free(S->pf_gm); free(S->pf_state);
    free(S);
}
