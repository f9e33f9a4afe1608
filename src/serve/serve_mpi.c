/* ds41 serve under mpiexec: rank 0's record of its engine calls and the followers' replay
 * (serve_mpi.h). */
#include "serve_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "dist_pipe.h"
#include "forward.h"
#include "lproc.h"
#include "restore.h"
#include "serve_req.h"
#include "serve_sched.h"
#include "spec.h"

/* how long rank 0 gives the HTTP threads to answer the requests in flight after a fault */
#define FAULT_ANSWER_S 2.0
/* --dp-attention: the bytes of a failed item's (or restore's) error in an answer to rank 0 */
#define ANSWER_ERR 248
/* --dp-attention: who samples a sequence: rank 0 from the logits row (a logits processor, or
 * rank 0's own), the owner, or the owner with logprobs of SAMP_OWNER_LP + n_top alternatives */
enum { SAMP_RANK0 = 0, SAMP_OWNER = 1, SAMP_OWNER_LP = 2 };

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
    long long ans_bytes, ans_tok, ans_lg;   /* rank 0: the other ranks' answers: bytes, rows answered with a token, with logits */
    long long props, verifies;    /* --spec: proposals and verify blocks run here for the sequences held here */
    long long batches;            /* --spec: the batched forwards those proposals ran in (DRAFTS) */
    long long lp_verifies;        /* --spec: those of sequences with a logits processor */
    long long g_verifies;         /* --spec: those of sequences with a grammar (rank 0's VMASK) */
    long long masks, mask_bytes;  /* rank 0: grammar masks sent to the owners (GMASK records, their bytes) */
    long long vmasks, vrows, vlists, vmask_bytes;   /* rank 0: VMASK records, their restricted rows, those sent as
                                                     * lists of ids, their bytes */
    long long rec_bytes, recs, steps;   /* rank 0: records broadcast (their bytes, length word included), STEP records */
    long long drafts_recs, drafts_props;  /* rank 0: DRAFTS records and the proposals they asked for (every rank's) */
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
    /* one write: the launcher forwards the ranks' stderr, and pieces of two ranks' lines
     * written apart could interleave */
    char line[2048];
    size_t n = 0;
#define ADD(...) do { if (n < sizeof line) n += (size_t)snprintf(line + n, sizeof line - n, __VA_ARGS__); } while (0)
    ADD("ds41 serve [rank %d]: %s: %lld sequences held here, at most %lld bytes of state at once (%lld of them global KV "
        "pages)", ds41_dist_rank(), dp ? "--dp-attention" : ds41_pipe_on() ? "--split layers" : "replicated attention",
        c->seqs, c->peak, c->peak_kv);
    if (c->props || c->verifies)
        ADD("; --spec: %lld proposals (%lld batched forwards), %lld verify blocks (%lld with a logits processor, %lld "
            "with a grammar)", c->props, c->batches, c->verifies, c->lp_verifies, c->g_verifies);
    long long os = 0, ob = 0;
    ds41_smirror_pipe_outcomes(&os, &ob);
    if (os) ADD("; verify outcomes: %lld steps, %lld bytes", os, ob);
    if (dp && ds41_dist_rank() == 0)
        ADD("; rank 0's copies of the other ranks' sequences: at most %lld bytes; their answers: %lld bytes, %lld rows with a "
            "token, %lld with logits; grammar masks sent: %lld (%lld bytes); verify masks sent: %lld blocks, %lld rows "
            "restricted (%lld as lists of ids), %lld bytes", c->peak_copies, c->ans_bytes, c->ans_tok, c->ans_lg, c->masks,
            c->mask_bytes, c->vmasks, c->vrows, c->vlists, c->vmask_bytes);
    if (ds41_dist_rank() == 0) ADD("; records sent: %lld bytes in %lld broadcasts, %lld steps", c->rec_bytes, c->recs, c->steps);
    if (dp && ds41_dist_rank() == 0 && (c->props || c->drafts_recs))
        ADD("; proposals asked together: %lld DRAFTS records for %lld proposals", c->drafts_recs, c->drafts_props);
#undef ADD
    fprintf(stderr, "%s\n", line);
}

/* ---------------------------------------------------------------- rank 0: recorder */

static int share_outcome(int32_t v[2], int k, char *err, size_t errcap);

struct ds41_smirror {
    int32_t *w;
    size_t n, cap;
    const ds41_session **sess;    /* open sessions, their ids and (--dp-attention) the rank that holds each */
    int32_t *sid;
    int *own;
    int *samp;                    /* --dp-attention: who samples the session (SAMP_*, SAMPLE) */
    struct ds41_lproc **glp;      /* --dp-attention: the processor of a session its owner samples with a grammar
                                   * held here (GRAMMAR; GMASK ahead of each row it samples), else NULL */
    uint32_t *gbits;              /* scratch: a row's allowed tokens */
    int32_t *glist;               /* scratch: a row's allowed ids (VMASK) */
    int *verr_row;                /* VMASK: the first row of the block whose mask set the grammar's error (-1: none);
                                   * the error is the sequence's only if the owner reaches that row */
    char (*verr)[sizeof ((ds41_lproc *)0)->err];   /* that error */
    unsigned char **lpend;        /* the owner's logprobs of its last tokens (one, or a verify's), not yet taken
                                   * (ds41_smirror_logprobs): two words (entries, the next one), then the entries */
    int n_sess, cap_sess;
    int dp;                       /* --dp-attention */
    int store;                    /* rank 0's cache has a --cache-dir store: disk reads are shipped (BLOCKS) */
    long long shipped_blocks, shipped_bytes;
    long long installs, install_bytes;   /* INSTALL records sent (serve --role decode) and their pages' and states' bytes */
    long long pd_forwards;        /* PD_FWD records sent (serve --role prefill) */
    int ended;                    /* END sent */
    int turn;                     /* the rank a tie goes to first */
    int route;                    /* the rank for the next open (ds41_smirror_route); -1: least-loaded */
    const ds41_session *open_s;   /* --dp-attention: the session opened last after a route, and the blocks */
    long long open_hit;           /* its owner's cache held of its prompt (the owner's PROBE answer; -1: none) */
    int *load;                    /* [ranks]: sessions each rank holds (scratch) */
    long long *held;              /* [ranks]: tokens they hold (scratch) */
    long long *hit;               /* [ranks]: cached blocks of the prompt being routed (scratch) */
    float *lg;                    /* a logits row from another rank (a whole-prompt restore) */
    dp_count dpc;
    int32_t next_id;
    double last;                  /* when the last record went out */
};

ds41_smirror *ds41_smirror_new(void) {
    ds41_smirror *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->last = now_s();
    m->dp = ds41_dist_dp();
    m->route = -1;
    if (!m->dp) ds41_spec_set_outcome_hook(share_outcome);
    int N = ds41_dist_size();
    m->load = calloc((size_t)N, sizeof *m->load);
    m->held = calloc((size_t)N, sizeof *m->held);
    m->hit = calloc((size_t)N, sizeof *m->hit);
    if (!m->load || !m->held || !m->hit) {
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
    for (int i = 0; i < m->n_sess; i++) free(m->lpend[i]);
    free(m->samp);
    free(m->glp);
    free(m->gbits);
    free(m->glist);
    free(m->verr_row);
    free(m->verr);
    free(m->lpend);
    free(m->load);
    free(m->held);
    free(m->hit);
    free(m->lg);
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
    m->dpc.rec_bytes += (long long)(sizeof len + (size_t)len * sizeof *m->w);
    m->dpc.recs++;
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

/* --dp-attention: the rank for a new sequence: the one whose prefix cache holds the most of
 * its prompt (hit, NULL: none asked), then the one holding the fewest sequences, then the
 * fewest tokens; among equals the next in turn after the last one chosen (one request at a
 * time then alternates, rather than all going to rank 0, which also runs the HTTP front) */
static int better(const ds41_smirror *m, const long long *hit, int q, int b) {
    if (hit && hit[q] != hit[b]) return hit[q] > hit[b];
    return m->load[q] < m->load[b] || (m->load[q] == m->load[b] && m->held[q] < m->held[b]);
}

static int least_loaded(ds41_smirror *m, const long long *hit) {
    int N = ds41_dist_size(), best = -1;
    memset(m->load, 0, (size_t)N * sizeof *m->load);
    memset(m->held, 0, (size_t)N * sizeof *m->held);
    for (int i = 0; i < m->n_sess; i++) {
        m->load[m->own[i]]++;
        m->held[m->own[i]] += ds41_session_pos(m->sess[i]);
    }
    for (int j = 0; j < N; j++) {
        int q = (m->turn + j) % N;
        if (best < 0 || better(m, hit, q, best)) best = q;
    }
    m->turn = (best + 1) % N;
    return best;
}

void ds41_smirror_open(ds41_smirror *m, const ds41_session *s, int rank0) {
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
        int *nsa = realloc(m->samp, (size_t)nc * sizeof *nsa);
        if (!nsa) oom();
        m->samp = nsa;
        ds41_lproc **ng = realloc(m->glp, (size_t)nc * sizeof *ng);
        if (!ng) oom();
        m->glp = ng;
        unsigned char **nlp = realloc(m->lpend, (size_t)nc * sizeof *nlp);
        if (!nlp) oom();
        m->lpend = nlp;
        int *nvr = realloc(m->verr_row, (size_t)nc * sizeof *nvr);
        if (!nvr) oom();
        m->verr_row = nvr;
        char (*nve)[sizeof ((ds41_lproc *)0)->err] = realloc(m->verr, (size_t)nc * sizeof *nve);
        if (!nve) oom();
        m->verr = nve;
        m->cap_sess = nc;
    }
    int32_t id = m->next_id;
    m->next_id = (m->next_id + 1) & INT32_MAX;
    int rank = !m->dp || rank0 ? 0 : m->route >= 0 ? m->route : least_loaded(m, NULL);
    m->open_s = s;
    m->open_hit = m->dp && m->route >= 0 ? m->hit[rank] : -1;
    m->route = -1;
    m->sess[m->n_sess] = s;
    m->own[m->n_sess] = rank;
    m->samp[m->n_sess] = SAMP_RANK0;
    m->glp[m->n_sess] = NULL;
    m->lpend[m->n_sess] = NULL;
    m->verr_row[m->n_sess] = -1;
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
    free(m->lpend[i]);
    m->samp[i] = m->samp[m->n_sess];
    m->glp[i] = m->glp[m->n_sess];
    m->lpend[i] = m->lpend[m->n_sess];
    m->verr_row[i] = m->verr_row[m->n_sess];
    memcpy(m->verr[i], m->verr[m->n_sess], sizeof m->verr[i]);
}

static void put_ids(ds41_smirror *m, int op, const ds41_session *s, const int32_t *ids, size_t n) {
    if (n > (size_t)INT32_MAX) oom();
    int32_t v[3] = { op, sid_of(m, s), (int32_t)n };
    put(m, v, 3);
    put(m, ids, n);
}

/* The owner's answer for a token it drew: the id, then with logprobs (samp >= SAMP_OWNER_LP)
 * its logprob, the n_top best ids and their logprobs, as rank 0 would compute them from the row. */
static size_t lp_bytes(int samp) { return samp >= SAMP_OWNER_LP ? sizeof(float) + (size_t)(samp - SAMP_OWNER_LP) * 8 : 0; }

static size_t token_bytes(int samp) { return sizeof(int32_t) + lp_bytes(samp); }

/* the logprobs entry of token id drawn from row (lp_bytes(samp) bytes at p) */
static unsigned char *lp_put(unsigned char *p, const float *row, int32_t id, int samp, int V) {
    if (samp < SAMP_OWNER_LP) return p;
    int k = samp - SAMP_OWNER_LP;
    float lp = 0, top_lp[DS41_REQ_MAX_TOP_LOGPROBS] = { 0 };
    int32_t top_id[DS41_REQ_MAX_TOP_LOGPROBS] = { 0 };
    if (id >= 0 && id < V) ds41_sched_logprobs(row, V, id, k, &lp, top_id, top_lp);   /* else rank 0 fails the row */
    memcpy(p, &lp, sizeof lp);
    memcpy(p + 4, top_id, (size_t)k * 4);
    memcpy(p + 4 + 4 * (size_t)k, top_lp, (size_t)k * 4);
    return p + 4 + 8 * (size_t)k;
}

/* lp: the owner's logits processor of s (NULL: none), which counts the token it drew as rank
 * 0's does when the token is emitted */
static unsigned char *token_put(unsigned char *p, ds41_session *s, ds41_lproc *lp, int samp, int failed, int V) {
    int32_t id = failed ? -1 : ds41_session_sample(s);
    if (lp && id >= 0) ds41_lproc_accept(lp, id);
    if (lp) lp->xset = -1;   /* a grammar's allowed tokens held for that row only (GMASK) */
    memcpy(p, &id, sizeof id);
    return lp_put(p + sizeof id, ds41_logits(s), id, samp, V);
}

/* rank 0: n logprobs entries of session slot i at p, for its next n tokens */
static void lp_keep(ds41_smirror *m, int i, const unsigned char *p, int n) {
    free(m->lpend[i]);
    m->lpend[i] = NULL;
    size_t lb = lp_bytes(m->samp[i]);
    if (!lb || n < 1) return;
    int32_t h[2] = { n, 0 };
    if (!(m->lpend[i] = malloc(sizeof h + (size_t)n * lb))) oom();
    memcpy(m->lpend[i], h, sizeof h);
    memcpy(m->lpend[i] + sizeof h, p, (size_t)n * lb);
}

/* rank 0: the token answer p of session slot i (n tokens ran there) */
static void token_take(ds41_smirror *m, int i, ds41_session *s, size_t n, const unsigned char *p) {
    int32_t id;
    memcpy(&id, p, sizeof id);
    ds41_session_absorb_token(s, n, id);
    lp_keep(m, i, p + sizeof id, 1);
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

void ds41_smirror_sampling(ds41_smirror *m, const ds41_session *s, float temperature, int top_k, float top_p, float min_p,
                           uint64_t seed, int n_top, ds41_lproc *lp) {
    if (!m || !m->dp) return;
    int i = slot_of(m, s);
    if (m->own[i] == 0 || n_top > DS41_REQ_MAX_TOP_LOGPROBS) return;   /* rank 0's own: sampled here as in one process */
    int proc = ds41_lproc_active(lp);
    if (proc && (lp->n_bias > DS41_REQ_MAX_BIAS || lp->n_pr_ids > INT32_MAX || lp->n_ban < 0)) return;
    m->samp[i] = n_top < 0 ? SAMP_OWNER : SAMP_OWNER_LP + n_top;
    int32_t v[9] = { DS41_SOP_SAMPLE, m->sid[i], (int32_t)fbits(temperature), top_k, (int32_t)fbits(top_p),
                     (int32_t)fbits(min_p), (int32_t)(uint32_t)seed, (int32_t)(uint32_t)(seed >> 32), n_top < 0 ? -1 : n_top };
    put(m, v, 9);
    if (!proc) return;
    /* the processor's settings and the prompt's distinct ids (ds41_lproc_prompt's, for the
     * repetition penalty); the counts follow from the tokens the owner draws */
    uint64_t mt = (uint64_t)(lp->min_tokens < 0 ? 0 : lp->min_tokens);
    uint64_t tb = (uint64_t)(lp->think_budget < 0 ? -1 : lp->think_budget);
    int32_t h[14] = { DS41_SOP_LPROC, m->sid[i], (int32_t)fbits(lp->freq), (int32_t)fbits(lp->pres), (int32_t)fbits(lp->rep),
                      lp->eos, (int32_t)(uint32_t)mt, (int32_t)(uint32_t)(mt >> 32), lp->think_budget < 0 ? -1 : lp->gate,
                      (int32_t)(uint32_t)tb, (int32_t)(uint32_t)(tb >> 32), lp->n_bias, lp->n_ban, (int32_t)lp->n_pr_ids };
    put(m, h, 14);
    put(m, lp->bias_id, (size_t)lp->n_bias);
    for (int k = 0; k < lp->n_bias; k++) put1(m, (int32_t)fbits(lp->bias_val[k]));
    put(m, lp->ban_ids, (size_t)lp->n_ban);
    put(m, lp->pr_ids, lp->n_pr_ids);
    if (!lp->gm) return;
    /* the grammar's matcher (with the tokenizer's token table) stays here: the owner gets the
     * allowed tokens of each row it samples (GMASK) */
    int32_t g[2] = { DS41_SOP_GRAMMAR, m->sid[i] };
    put(m, g, 2);
    m->glp[i] = lp;
}

/* GMASK: the allowed tokens of the row the owner of session slot i samples next (its grammar
 * after the tokens taken so far, as ds41_lproc_apply would mask it here) */
static void put_gmask(ds41_smirror *m, int i) {
    ds41_lproc *lp = m->glp[i];
    size_t W = ((size_t)lp->V + 31) / 32;
    if (!m->gbits && !(m->gbits = malloc(W * sizeof *m->gbits))) oom();
    int on = ds41_lproc_allowed(lp, NULL, 0, m->gbits);
    int32_t v[4] = { DS41_SOP_GMASK, m->sid[i], on, on ? (int32_t)W : 0 };
    put(m, v, 4);
    if (on) put(m, (const int32_t *)(const void *)m->gbits, W);
    m->dpc.masks++;
    m->dpc.mask_bytes += (long long)(sizeof v + (on ? W * sizeof *m->gbits : 0));
}

/* VMASK: the allowed tokens of each row of the verify block b of session slot i, which its owner
 * decides: row r after the drafts b->ids[1..r], as one process's verify masks it
 * (ds41_spec_verify_end: ds41_lproc_apply past the drafts before the row). Only the rows the
 * grammar restricts go, each as a bitset or its allowed ids, whichever is shorter. One process
 * masks only the rows it reaches (up to the first rejection): a grammar error (a limit) that the
 * mask of a later row sets here is kept aside (verr) and becomes the sequence's only when the
 * owner's answer reaches that row (verify_take). */
static void put_vmask(ds41_smirror *m, int i, const ds41_batch_item *b) {
    ds41_lproc *lp = m->glp[i];
    int V = lp->V, T = (int)b->n;
    size_t W = ((size_t)V + 31) / 32;
    if (!m->gbits && !(m->gbits = malloc(W * sizeof *m->gbits))) oom();
    if (!m->glist && !(m->glist = malloc(W * sizeof *m->glist))) oom();
    int32_t v[4] = { DS41_SOP_VMASK, m->sid[i], T, 0 };
    size_t at = m->n, n0 = m->n;
    put(m, v, 4);
    int had = lp->err[0] != 0;
    m->verr_row[i] = -1;
    for (int r = 0; r < T; r++) {
        int on = ds41_lproc_allowed(lp, b->ids + 1, r, m->gbits);
        if (!had && lp->err[0]) {
            if (m->verr_row[i] < 0) {
                m->verr_row[i] = r;
                memcpy(m->verr[i], lp->err, sizeof m->verr[i]);
            }
            lp->err[0] = 0;
        }
        if (!on) continue;
        size_t c = 0;
        for (int t = 0; t < V && c < W; t++)
            if (m->gbits[t >> 5] >> (t & 31) & 1u) m->glist[c++] = t;
        int list = c < W;
        int32_t h[3] = { r, list ? 2 : 1, (int32_t)(list ? c : W) };
        put(m, h, 3);
        if (list) put(m, m->glist, c);
        else put(m, (const int32_t *)(const void *)m->gbits, W);
        m->w[at + 3]++;
        m->dpc.vrows++;
        m->dpc.vlists += list;
    }
    m->dpc.vmasks++;
    m->dpc.vmask_bytes += (long long)((m->n - n0) * sizeof *m->w);
}

int ds41_smirror_logprobs(ds41_smirror *m, const ds41_session *s, int n_top, float *lp, int32_t *top_id, float *top_lp) {
    if (!m || !m->dp) return 0;
    int i = slot_of(m, s);
    unsigned char *b = m->lpend[i];
    if (!b || m->samp[i] != SAMP_OWNER_LP + n_top) return 0;
    int32_t h[2];
    memcpy(h, b, sizeof h);
    const unsigned char *p = b + sizeof h + (size_t)h[1] * lp_bytes(m->samp[i]);
    memcpy(lp, p, sizeof *lp);
    memcpy(top_id, p + 4, (size_t)n_top * sizeof *top_id);
    memcpy(top_lp, p + 4 + 4 * (size_t)n_top, (size_t)n_top * sizeof *top_lp);
    if (++h[1] < h[0]) memcpy(b, h, sizeof h);
    else {
        free(b);
        m->lpend[i] = NULL;
    }
    return 1;
}

/* n bytes from rank q (one message of the answer tag, ds41_dist_dp_send0) */
static void recv_from(ds41_smirror *m, int q, void *buf, size_t n) {
    int N = ds41_dist_size();
    void **b = calloc((size_t)N, sizeof *b);
    size_t *nb = calloc((size_t)N, sizeof *nb);
    if (!b || !nb) oom();
    b[q] = buf;
    nb[q] = n;
    ds41_dist_dp_recv0(b, nb);
    m->dpc.ans_bytes += (long long)n;
    free(b);
    free(nb);
}

/* IMAGES' and PROBE_IMG's flags and content keys of im's n positions */
static void put_image_keys(ds41_smirror *m, const ds41_prefix_img *im) {
    for (size_t j = 0; j < im->n; j++) put1(m, im->is_image[j] ? 1 : 0);
    for (size_t j = 0; j < im->n; j++)
        if (im->is_image[j]) put(m, (const int32_t *)(const void *)(im->key + j * 32), 8);
}

void ds41_smirror_route(ds41_smirror *m, ds41_prefix_cache *pc, const int32_t *ids, size_t n, const ds41_prefix_img *im) {
    if (!m || !m->dp || !pc || !n) return;
    int N = ds41_dist_size();
    if (im && (!im->is_image || !im->key || im->n != n)) im = NULL;
    int32_t v[2] = { im ? DS41_SOP_PROBE_IMG : DS41_SOP_PROBE, (int32_t)n };
    if (n > (size_t)INT32_MAX) oom();
    put(m, v, 2);
    put(m, ids, n);
    if (im) put_image_keys(m, im);
    flush(m);
    uint8_t **pg = NULL;
    m->hit[0] = ds41_prefix_pages_img(pc, ids, n, im, &pg);
    ds41_prefix_pages_free(pc, pg, m->hit[0]);
    for (int q = 1; q < N; q++) {
        int64_t h = 0;
        recv_from(m, q, &h, sizeof h);
        m->hit[q] = h < 0 ? 0 : h;
    }
    m->route = least_loaded(m, m->hit);
}

void ds41_smirror_store(ds41_smirror *m) {
    if (m) m->store = 1;
}

/* --cache-dir: the blocks of ids that rank 0's cache reads from its store go to the followers
 * first (BLOCKS), so that every rank's restore finds the same chain in memory */
static void ship_disk_blocks(ds41_smirror *m, ds41_prefix_cache *pc, const ds41_session *s, const int32_t *ids, size_t n,
                             const ds41_prefix_img *im) {
    long long first = 0;
    uint8_t *bytes = NULL;
    size_t len = 0;
    long long nb = ds41_prefix_load(pc, ids, n, im, &first, &bytes, &len);
    if (nb < 0) oom();
    if (nb > 0) {
        if (len > (size_t)INT32_MAX - 3) oom();
        /* the session: its image positions (IMAGES) key the blocks on the other ranks as here */
        put_ids(m, DS41_SOP_BLOCKS, s, ids, n);
        int32_t t[3] = { (int32_t)first, (int32_t)nb, (int32_t)len };
        put(m, t, 3);
        size_t words = (len + 3) / 4;
        int32_t *pad = calloc(words, sizeof *pad);
        if (!pad) oom();
        memcpy(pad, bytes, len);
        put(m, pad, words);
        free(pad);
        m->shipped_blocks += nb;
        m->shipped_bytes += (long long)len;
    }
    free(bytes);
}

long long ds41_smirror_held(ds41_smirror *m, ds41_prefix_cache *pc, const ds41_session *s, const int32_t *ids, size_t n) {
    if (!m || !m->dp) return ds41_prefix_held(pc, ids, n, NULL);
    return s == m->open_s && m->open_hit > 0 ? m->open_hit : 0;
}

int ds41_smirror_install(ds41_smirror *m, ds41_prefix_cache *pc, const ds41_session *s, const int32_t *ids, size_t n,
                         int first, int nb, uint8_t *const *pages, const size_t *page_bytes, int n_stores,
                         const uint8_t *res, size_t res_len) {
    if (!m) return 1;
    /* the local hit's blocks that rank 0's cache reads from its store: in every rank's memory
     * first, so that every rank's install finds the same chain (under --dp-attention the owner
     * reads its own store) */
    if (m->store && !m->dp && first > 0) ship_disk_blocks(m, pc, s, ids, (size_t)first * DS41_PREFIX_BLOCK, NULL);
    size_t pb = 0;
    for (int j = 0; j < n_stores; j++) pb += page_bytes[j];
    size_t len = pb * (size_t)nb;
    if (len + res_len > (size_t)INT32_MAX - 3 || n > (size_t)INT32_MAX) oom();
    put_ids(m, DS41_SOP_INSTALL, s, ids, n);
    int32_t t[4] = { first, nb, (int32_t)len, (int32_t)res_len };
    put(m, t, 4);
    size_t words = (len + res_len + 3) / 4;
    uint8_t *pad = calloc(words, sizeof(int32_t));
    if (!pad) oom();
    size_t off = 0;
    for (int b = 0; b < nb; b++)
        for (int j = 0; j < n_stores; j++) {
            memcpy(pad + off, pages[(size_t)b * (size_t)n_stores + (size_t)j], page_bytes[j]);
            off += page_bytes[j];
        }
    memcpy(pad + off, res, res_len);
    put(m, (const int32_t *)(const void *)pad, words);
    free(pad);
    m->installs++;
    m->install_bytes += (long long)(len + res_len);
    flush(m);   /* the install of the decoder stream's form runs the decoder layers: a forward */
    return !m->dp || m->own[slot_of(m, s)] == 0;
}

long long ds41_smirror_install_end(ds41_smirror *m, ds41_engine *e, ds41_session *s, size_t n, long long got) {
    if (!m || !m->dp) return got;
    ds41_dist_dp_done(&e->ctx);   /* the owner's forward of the decoder layers (the stream's form) */
    int q = m->own[slot_of(m, s)];
    if (q == 0) return got;
    int64_t h = 0;
    recv_from(m, q, &h, sizeof h);
    if (h < 0 || h >= (int64_t)n) {
        char eb[160];
        snprintf(eb, sizeof eb, "rank %d installed %lld tokens of a remote prefill of a %zu-token prompt", q, (long long)h, n);
        ds41_session_absorb(s, 0, NULL, eb);
        return -1;
    }
    if (h > 0) ds41_session_absorb(s, (size_t)h, NULL, NULL);   /* a prompt part: no logits */
    return h;
}

void ds41_smirror_pd_load(ds41_smirror *m, ds41_prefix_cache *pc, const ds41_session *s, const int32_t *ids, size_t n) {
    if (m && m->store && !m->dp && pc) ship_disk_blocks(m, pc, s, ids, n, NULL);
}

void ds41_smirror_pd_seq(ds41_smirror *m, const ds41_session *s, int stop_layer, const int32_t *ids, size_t n) {
    if (!m) return;
    if (n > (size_t)INT32_MAX) oom();
    int32_t v[4] = { DS41_SOP_PD_SEQ, sid_of(m, s), stop_layer, (int32_t)n };
    put(m, v, 4);
    put(m, ids, n);
}

void ds41_smirror_pd_forward(ds41_smirror *m, const ds41_session *s, long long k, const int32_t *ids, size_t n) {
    if (!m) return;
    if (n > (size_t)INT32_MAX) oom();
    int32_t v[4] = { DS41_SOP_PD_FWD, sid_of(m, s), (int32_t)k, (int32_t)n };
    put(m, v, 4);
    put(m, ids, n);
    m->pd_forwards++;
    flush(m);   /* the forward */
}

long long ds41_smirror_restore(ds41_smirror *m, ds41_engine *e, ds41_prefix_cache *pc, ds41_session *s, const int32_t *ids,
                               size_t n, const ds41_prefix_img *im) {
    if (!m) return ds41_prefix_restore_img(pc, s, ids, n, im);
    if (m->store && !m->dp) ship_disk_blocks(m, pc, s, ids, n, im);
    /* a restore of the whole prompt samples its first token on the owner */
    if (m->dp && m->glp[slot_of(m, s)]) put_gmask(m, slot_of(m, s));
    put_ids(m, DS41_SOP_RESTORE, s, ids, n);
    flush(m);   /* the restore replays through the forward */
    if (!m->dp) return ds41_prefix_restore_job(pc, s, ids, n, im, ds41_pipe_on() && ds41_prefix_has_store(pc));
    int i = slot_of(m, s), q = m->own[i];
    long long hit = q == 0 ? ds41_prefix_restore_img(pc, s, ids, n, im) : 0;
    ds41_dist_dp_done(&e->ctx);   /* the owner's replay forward: every rank joins its exchanges */
    if (q == 0) return hit;
    /* the owner's answer: its hit (-1: failed, its error follows), then for a whole prompt the
     * token it drew or the logits of the last row */
    int64_t h = 0;
    recv_from(m, q, &h, sizeof h);
    if (h < 0) {
        char eb[ANSWER_ERR];
        recv_from(m, q, eb, sizeof eb);
        eb[sizeof eb - 1] = 0;
        ds41_session_absorb(s, 0, NULL, eb);
        return -1;
    }
    if (h > (int64_t)n) {
        char eb[160];
        snprintf(eb, sizeof eb, "rank %d restored %lld tokens of a %zu-token prompt", q, (long long)h, n);
        ds41_session_absorb(s, 0, NULL, eb);
        return -1;
    }
    if (h > 0 && h == (int64_t)n && m->samp[i] != SAMP_RANK0) {
        size_t tb = token_bytes(m->samp[i]);
        unsigned char *tk = malloc(tb);
        if (!tk) oom();
        recv_from(m, q, tk, tb);
        token_take(m, i, s, (size_t)h, tk);
        free(tk);
        m->dpc.ans_tok++;
    } else if (h > 0 && h == (int64_t)n) {
        size_t V = (size_t)ds41_vocab_size(e);
        if (!m->lg && !(m->lg = malloc(V * sizeof *m->lg))) oom();
        recv_from(m, q, m->lg, V * sizeof *m->lg);
        ds41_session_absorb(s, (size_t)h, m->lg, NULL);
        m->dpc.ans_lg++;
    } else if (h > 0) {
        ds41_session_absorb(s, (size_t)h, NULL, NULL);
    }
    return h;
}

int ds41_smirror_publish(ds41_smirror *m, const ds41_session *s, const int32_t *ids, size_t n) {
    if (!m) return 1;
    put_ids(m, DS41_SOP_PUBLISH, s, ids, n);
    return !m->dp || m->own[slot_of(m, s)] == 0;
}

void ds41_smirror_trim(ds41_smirror *m, long long bytes) {
    if (!m) return;
    uint64_t b = (uint64_t)(bytes < 0 ? 0 : bytes);
    int32_t v[3] = { DS41_SOP_TRIM, (int32_t)(uint32_t)b, (int32_t)(uint32_t)(b >> 32) };
    put(m, v, 3);
}

void ds41_smirror_step(ds41_smirror *m, const ds41_batch_item *it, int count) {
    if (!m || count < 1) return;
    /* the rows an owner samples with a grammar held here: their allowed tokens first */
    for (int i = 0; i < count && m->dp; i++) {
        int j = slot_of(m, it[i].s);
        if (m->glp[j] && it[i].verify) put_vmask(m, j, &it[i]);
        else if (m->glp[j] && it[i].ahead == 0) put_gmask(m, j);
    }
    int32_t v[2] = { DS41_SOP_STEP, count };
    put(m, v, 2);
    m->dpc.steps++;
    for (int i = 0; i < count; i++) {
        int32_t h[3] = { sid_of(m, it[i].s), (int32_t)it[i].n, it[i].verify ? DS41_SOP_VERIFY : (int32_t)it[i].ahead };
        put(m, h, 3);
        put(m, it[i].ids, it[i].n);
    }
    flush(m);
}

/* --split layers: the last stage's answer to a DRAFT (ds41_pipe_answer, kind 5): a status
 * word (0: proposed), the B drafts, their B confidences; after a failed proposal its error in
 * a second message (ANSWER_ERR bytes, kind 6). Every DSpark target layer must sit on the last
 * stage (its taps are read there). */
static int pipe_draft_check(const ds41_engine *e, char *err, size_t errcap) {
    for (int ti = 0; ti < e->cfg->n_dspark_targets; ti++)
        if (!ds41_pipe_holds_last(e->pipe, e->cfg->dspark_targets[ti]))
            return snprintf(err, errcap, "draft: DSpark target layer %d is not on the last stage (its taps would have to "
                            "cross the stages; not supported)", e->cfg->dspark_targets[ti]), -1;
    return 0;
}

/* the last stage's answer to rank 0 for one proposal (rc != 0: failed with message msg) */
static void pipe_answer_send(ds41_engine *e, int rc, const char *msg, const int32_t *ids, const float *conf) {
    int B = ds41_draft_block_size(e);
    char eb[ANSWER_ERR] = { 0 };
    if (rc) snprintf(eb, sizeof eb, "%s", msg);
    size_t nb = sizeof(int32_t) * (1 + 2 * (size_t)B);
    unsigned char *a = calloc(1, nb);
    if (!a) ds41_dist_fatal(1, "out of memory for the answer to a proposal");
    int32_t st = rc != 0;
    memcpy(a, &st, sizeof st);
    if (!st) {
        memcpy(a + sizeof st, ids, (size_t)B * sizeof *ids);
        memcpy(a + sizeof st + (size_t)B * sizeof *ids, conf, (size_t)B * sizeof *conf);
    }
    ds41_pipe_answer(e->pipe, a, nb, 5, "the proposal, from the last stage");
    if (st) ds41_pipe_answer(e->pipe, eb, sizeof eb, 6, "the proposal's error, from the last stage");
    free(a);
}

static void pipe_draft_answer(ds41_engine *e, ds41_session *s, int32_t t_next, int32_t *ids, float *conf) {
    char eb[ANSWER_ERR] = { 0 };
    int rc = pipe_draft_check(e, eb, sizeof eb);
    if (!rc && (rc = ds41_session_draft(s, t_next, ids, conf)) != 0) snprintf(eb, sizeof eb, "%s", ds41_session_error(s));
    pipe_answer_send(e, rc, eb, ids, conf);
}

static int pipe_draft_take(ds41_engine *e, ds41_session *s, int32_t *ids, float *conf) {
    int B = ds41_draft_block_size(e);
    size_t nb = sizeof(int32_t) * (1 + 2 * (size_t)B);
    unsigned char *a = malloc(nb);
    if (!a) oom();
    ds41_pipe_answer(e->pipe, a, nb, 5, "the proposal, from the last stage");
    int32_t st;
    memcpy(&st, a, sizeof st);
    if (st) {
        char eb[ANSWER_ERR];
        ds41_pipe_answer(e->pipe, eb, sizeof eb, 6, "the proposal's error, from the last stage");
        eb[ANSWER_ERR - 1] = 0;
        ds41_session_absorb(s, 0, NULL, eb[0] ? eb : "the proposal failed on the last stage");
    } else {
        memcpy(ids, a + sizeof st, (size_t)B * sizeof *ids);
        memcpy(conf, a + sizeof st + (size_t)B * sizeof *ids, (size_t)B * sizeof *conf);
        for (int j = 0; j < B && !st; j++)
            if (ids[j] < 0 || ids[j] >= ds41_vocab_size(e)) {
                char eb[ANSWER_ERR];
                snprintf(eb, sizeof eb, "the last stage proposed token %d, outside the vocabulary of %d", (int)ids[j],
                         ds41_vocab_size(e));
                ds41_session_absorb(s, 0, NULL, eb);
                st = 1;
            }
    }
    free(a);
    return st ? -1 : 0;
}

/* --dp-attention: the owner's answer to a DRAFT: a status word (0: proposed), the B drafts,
 * their B confidences (float bits), then ANSWER_ERR bytes of error (the status says failed) */
static size_t draft_answer_bytes(int B) { return sizeof(int32_t) * (1 + 2 * (size_t)B) + ANSWER_ERR; }

/* rank 0: the owner's answer a (draft_answer_bytes(B) bytes) to the proposal of s */
static int draft_take(ds41_session *s, const unsigned char *a, int B, int32_t *ids, float *conf) {
    int32_t st;
    memcpy(&st, a, sizeof st);
    if (st) {
        char eb[ANSWER_ERR];
        memcpy(eb, a + draft_answer_bytes(B) - ANSWER_ERR, ANSWER_ERR);
        eb[ANSWER_ERR - 1] = 0;
        ds41_session_absorb(s, 0, NULL, eb[0] ? eb : "the proposal failed on the rank that holds the sequence");
        return -1;
    }
    memcpy(ids, a + sizeof st, (size_t)B * sizeof *ids);
    memcpy(conf, a + sizeof st + (size_t)B * sizeof *ids, (size_t)B * sizeof *conf);
    return 0;
}

int ds41_smirror_propose(ds41_smirror *m, ds41_engine *e, ds41_session *s, int32_t t_next, int32_t *ids, float *conf) {
    if (!m) return ds41_session_draft(s, t_next, ids, conf);
    int32_t v[3] = { DS41_SOP_DRAFT, sid_of(m, s), t_next };
    put(m, v, 3);
    flush(m);   /* the proposal runs DSpark's MoE layers */
    if (!m->dp && ds41_pipe_stages(e->pipe) > 1) return pipe_draft_take(e, s, ids, conf);
    if (!m->dp) return ds41_session_draft(s, t_next, ids, conf);
    /* --dp-attention: the owner proposes (its stages' exchanges a forward round of their own),
     * the other ranks join them */
    int q = m->own[slot_of(m, s)];
    int rc = q == 0 ? ds41_session_draft(s, t_next, ids, conf) : 0;
    m->dpc.props += q == 0;
    ds41_dist_dp_done(&e->ctx);
    if (q == 0) return rc;
    int B = ds41_draft_block_size(e);
    size_t nb = draft_answer_bytes(B);
    unsigned char *a = malloc(nb);
    if (!a) oom();
    recv_from(m, q, a, nb);
    rc = draft_take(s, a, B, ids, conf);
    free(a);
    return rc;
}

void ds41_smirror_propose_all(ds41_smirror *m, ds41_engine *e, int n, ds41_session *const *s, const int32_t *t_next,
                              int ndraft, int32_t *const *ids, float *const *conf, int *rc) {
    if (!m) {   /* one process: one batched proposal (ds41_session_draft_all) */
        ds41_session_draft_all(n, s, t_next, ndraft, ids, conf, rc);
        return;
    }
    if (n < 2) {
        for (int i = 0; i < n; i++) rc[i] = ds41_smirror_propose(m, e, s[i], t_next[i], ids[i], conf[i]);
        return;
    }
    if (!m->dp) {
        /* replicated: one DRAFTS record, and every rank proposes them all in one batched
         * forward; --split layers: the last stage does, and answers rank 0 for each in order */
        int32_t v[2] = { DS41_SOP_DRAFTS, n };
        put(m, v, 2);
        for (int i = 0; i < n; i++) {
            int32_t p[2] = { sid_of(m, s[i]), t_next[i] };
            put(m, p, 2);
        }
        m->dpc.drafts_recs++;
        m->dpc.drafts_props += n;
        flush(m);   /* the proposals run DSpark's MoE layers */
        if (ds41_pipe_stages(e->pipe) > 1) {
            for (int i = 0; i < n; i++) rc[i] = pipe_draft_take(e, s[i], ids[i], conf[i]);
            return;
        }
        ds41_session_draft_all(n, s, t_next, ndraft, ids, conf, rc);   /* the followers make every draft: the head is local */
        m->dpc.props += n;
        m->dpc.batches++;
        return;
    }
    int N = ds41_dist_size(), B = ds41_draft_block_size(e);
    size_t ab = draft_answer_bytes(B);
    int *own = malloc((size_t)n * sizeof *own);
    size_t *nb = calloc((size_t)N, sizeof *nb);
    unsigned char **buf = calloc((size_t)N, sizeof *buf);
    if (!own || !nb || !buf) oom();
    int32_t v[2] = { DS41_SOP_DRAFTS, n };
    put(m, v, 2);
    for (int i = 0; i < n; i++) {
        own[i] = m->own[slot_of(m, s[i])];
        int32_t p[2] = { sid_of(m, s[i]), t_next[i] };
        put(m, p, 2);
        if (own[i] != 0) nb[own[i]] += ab;
    }
    m->dpc.drafts_recs++;
    m->dpc.drafts_props += n;
    flush(m);   /* the proposals run DSpark's MoE layers */
    /* rank 0's own in one batched proposal (ds41_session_draft_all); each owner proposes its
     * own meanwhile, the forwards sharing the exchange's rounds, and the ranks with fewer join
     * the rest with zero rows */
    {
        ds41_session **ms = malloc((size_t)n * sizeof *ms);
        int32_t *mt = malloc((size_t)n * sizeof *mt), **mi = malloc((size_t)n * sizeof *mi);
        float **mc = malloc((size_t)n * sizeof *mc);
        int *mrc = malloc((size_t)n * sizeof *mrc), k = 0;
        if (!ms || !mt || !mi || !mc || !mrc) oom();
        for (int i = 0; i < n; i++)
            if (own[i] == 0) ms[k] = s[i], mt[k] = t_next[i], mi[k] = ids[i], mc[k++] = conf[i];
        if (k) ds41_session_draft_all(k, ms, mt, ndraft, mi, mc, mrc);
        for (int i = 0, j = 0; i < n; i++)
            if (own[i] == 0) rc[i] = mrc[j++];
        m->dpc.props += k;
        m->dpc.batches += k > 0;
        free(ms); free(mt); free(mi); free(mc); free(mrc);
    }
    ds41_dist_dp_done(&e->ctx);
    for (int q = 1; q < N; q++)
        if (nb[q] && !(buf[q] = malloc(nb[q]))) oom();
    ds41_dist_dp_recv0((void *const *)buf, nb);
    for (int q = 1; q < N; q++) m->dpc.ans_bytes += (long long)nb[q];
    size_t *at = calloc((size_t)N, sizeof *at);
    if (!at) oom();
    for (int i = 0; i < n; i++) {
        int q = own[i];
        if (q == 0) continue;
        rc[i] = draft_take(s[i], buf[q] + at[q], B, ids[i], conf[i]);
        at[q] += ab;
    }
    for (int q = 1; q < N; q++) free(buf[q]);
    free(at); free(buf); free(nb); free(own);
}

int ds41_smirror_calibrate(ds41_smirror *m, ds41_engine *e, int width, int prompt_len, int reps, ds41_spec_curve *c,
                           char *err, size_t errcap) {
    if (m) {
        int32_t v[4] = { DS41_SOP_CALIBRATE, width, prompt_len, reps };
        put(m, v, 4);
        flush(m);
    }
    int rc = ds41_spec_calibrate(e, width, prompt_len, reps, c, err, errcap);
    /* --dp-attention: rank 0's forwards alone; the other ranks joined them */
    if (m && m->dp) ds41_dist_dp_done(&e->ctx);
    return rc;
}

void ds41_smirror_images(ds41_smirror *m, const ds41_session *s, const ds41_prefix_img *im, int dim) {
    if (!m || !im || !im->is_image || !im->key || !im->emb) return;
    if (im->n > (size_t)INT32_MAX) oom();
    int32_t v[4] = { DS41_SOP_IMAGES, sid_of(m, s), (int32_t)im->n, dim };
    put(m, v, 4);
    put_image_keys(m, im);
    for (size_t j = 0; j < im->n; j++)
        if (im->is_image[j]) put(m, (const int32_t *)(const void *)(im->emb + j * (size_t)dim), (size_t)dim);
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

/* --dp-attention: an item's answer to rank 0, in step order: a status word (1: the item
 * failed; its error follows in a second message, ANSWER_ERR bytes per failed item), then,
 * where the forward computed logits (every item but a prompt part that goes on), the token
 * the owner drew (a sequence it samples, samp != SAMP_RANK0: the token, and with logprobs its
 * logprob, the n_top best ids and their logprobs) or else the logits row. */
/* A verify block of T = n rows (--spec; the owner samples the sequence and decides): the
 * accepted drafts A, the tokens out n_out (A + 1), out[T] (n_out of them set), then with
 * logprobs an entry per row (lp_put, n_out of them set). */
static size_t verify_bytes(size_t T, int samp) { return sizeof(int32_t) * (2 + T) + T * lp_bytes(samp); }

static size_t answer_bytes(const ds41_batch_item *b, int samp, int V) {
    if (b->verify) return sizeof(int32_t) + verify_bytes(b->n, samp);
    return sizeof(int32_t) + (b->ahead == 0 ? (samp != SAMP_RANK0 ? token_bytes(samp) : (size_t)V * sizeof(float)) : 0);
}

static unsigned char *verify_put(unsigned char *p, const ds41_batch_item *b, ds41_lproc *lp, int samp, int failed, int V) {
    size_t nb = verify_bytes(b->n, samp);
    memset(p, 0, nb);
    if (lp) lp->xrows = 0;   /* a grammar's allowed tokens held for that block only (VMASK) */
    if (failed) return p + nb;
    /* the owner's processor counts the tokens the verify gave, as rank 0's counts them emitted */
    for (int j = 0; lp && j < b->n_out; j++) ds41_lproc_accept(lp, b->out[j]);
    int32_t h[2] = { b->n_accepted, b->n_out };
    memcpy(p, h, sizeof h);
    memcpy(p + sizeof h, b->out, (size_t)b->n_out * sizeof *b->out);
    unsigned char *l = p + sizeof(int32_t) * (2 + b->n);
    for (int j = 0; j < b->n_out && lp_bytes(samp); j++) l = lp_put(l, b->out_logits + (size_t)j * V, b->out[j], samp, V);
    return p + nb;
}

/* rank 0: the verify answer p of session slot i; NULL, or what was wrong with it */
static const char *verify_take(ds41_smirror *m, int i, ds41_batch_item *b, const unsigned char *p, int V) {
    int32_t h[2];
    memcpy(h, p, sizeof h);
    int T = (int)b->n;
    if (h[0] < 0 || h[0] >= T || h[1] != h[0] + 1) return "the owner's verify outcome is out of range";
    memcpy(b->out, p + sizeof h, (size_t)h[1] * sizeof *b->out);
    for (int j = 0; j < h[1]; j++)
        if (b->out[j] < 0 || b->out[j] >= V) return "the owner's verify outcome holds a token outside the vocabulary";
    if (ds41_session_absorb_verify(b->s, T - 1, h[0])) return "out of memory for the speculative state of a verify";
    /* a grammar error from the mask of a row the owner reached (put_vmask) */
    if (m->glp[i] && m->verr_row[i] >= 0 && m->verr_row[i] <= h[0] && !m->glp[i]->err[0])
        memcpy(m->glp[i]->err, m->verr[i], sizeof m->glp[i]->err);
    m->verr_row[i] = -1;
    b->n_accepted = h[0];
    b->n_out = h[1];
    lp_keep(m, i, p + sizeof(int32_t) * (2 + (size_t)T), h[1]);
    return NULL;
}

static unsigned char *answer_put(unsigned char *p, const ds41_batch_item *b, ds41_lproc *lp, int samp, int V) {
    const char *err = ds41_session_error(b->s);
    int32_t st = err && err[0];
    memcpy(p, &st, sizeof st);
    p += sizeof st;
    if (b->verify) {
        p = verify_put(p, b, lp, samp, st, V);
    } else if (b->ahead == 0 && samp != SAMP_RANK0) {
        p = token_put(p, b->s, lp, samp, st, V);
    } else if (b->ahead == 0) {
        memcpy(p, ds41_logits(b->s), (size_t)V * sizeof(float));
        p += (size_t)V * sizeof(float);
    }
    return p;
}

/* err: the item's error (NULL: it ran) */
static const unsigned char *answer_take(ds41_smirror *m, int slot, const unsigned char *p, ds41_batch_item *b, int V,
                                        const char *err) {
    int samp = m->samp[slot];
    p += sizeof(int32_t);
    if (b->verify) {
        if (!err) err = verify_take(m, slot, b, p, V);
        p += verify_bytes(b->n, samp);
    } else if (b->ahead == 0 && samp != SAMP_RANK0) {
        if (!err) token_take(m, slot, b->s, b->n, p);
        p += token_bytes(samp);
    } else {
        const float *lg = NULL;
        if (b->ahead == 0) {
            lg = (const float *)p;
            p += (size_t)V * sizeof(float);
        }
        if (!err) ds41_session_absorb(b->s, b->n, lg, NULL);
    }
    if (err) ds41_session_absorb(b->s, b->n, NULL, err);
    b->failed = err != NULL;
    return p;
}

static int32_t answer_status(const unsigned char *p) {
    int32_t st;
    memcpy(&st, p, sizeof st);
    return st;
}

int ds41_smirror_overlap(const ds41_smirror *m, const ds41_engine *e) { return m && !m->dp && e->pipe; }

int ds41_smirror_batch_begin(ds41_smirror *m, ds41_engine *e, ds41_batch_item *it, int count) {
    int forwards = 0;
    ds41_smirror_step(m, it, count);
    ds41_smirror_pipe_begin(e, it, count, &forwards);   /* per-item failures: the sessions say */
    return forwards;
}

void ds41_smirror_batch_end(ds41_smirror *m, ds41_engine *e, ds41_batch_item *it, int count, int handle) {
    ds41_smirror_pipe_end(e, it, count, handle);   /* per-item failures: the sessions say */
    for (int i = 0; i < count; i++) m->dpc.verifies += it[i].verify != 0;
    dp_measure(&m->dpc, (ds41_session *const *)m->sess, NULL, m->n_sess, 0);
}

void ds41_smirror_batch_step(ds41_smirror *m, ds41_engine *e, ds41_batch_item *it, int count) {
    if (!m) { ds41_batch_step(it, count); return; }
    if (!m->dp) {   /* --split layers: micro-batches through the stages */
        ds41_smirror_batch_end(m, e, it, count, ds41_smirror_batch_begin(m, e, it, count));
        return;
    }
    ds41_smirror_step(m, it, count);
    /* rank 0's own items in one batch, in step order */
    int N = ds41_dist_size(), V = ds41_vocab_size(e), n0 = 0;
    ds41_batch_item *mine = malloc((size_t)count * sizeof *mine);
    int *slot = malloc((size_t)count * sizeof *slot);
    size_t *nb = calloc((size_t)N, sizeof *nb), *ne = calloc((size_t)N, sizeof *ne);
    unsigned char **buf = calloc((size_t)N, sizeof *buf);
    char **ebuf = calloc((size_t)N, sizeof *ebuf);
    const unsigned char **at = calloc((size_t)N, sizeof *at);
    const char **eat = calloc((size_t)N, sizeof *eat);
    if (!mine || !slot || !nb || !ne || !buf || !ebuf || !at || !eat) oom();
    for (int i = 0; i < count; i++) {
        slot[i] = slot_of(m, it[i].s);
        int q = m->own[slot[i]];
        if (q != 0 && it[i].verify && m->samp[slot[i]] == SAMP_RANK0) {
            /* ds41_smirror_open keeps such a sequence on rank 0 under --spec */
            fprintf(stderr, "ds41 serve: a verify block of a sequence that rank 0 samples is held by rank %d; ending the job\n", q);
            abort();
        }
        if (q == 0) {
            m->dpc.verifies += it[i].verify;
            mine[n0++] = it[i];
        } else {
            nb[q] += answer_bytes(&it[i], m->samp[slot[i]], V);
            if (it[i].ahead == 0) {
                m->dpc.ans_tok += m->samp[slot[i]] != SAMP_RANK0;
                m->dpc.ans_lg += m->samp[slot[i]] == SAMP_RANK0;
            }
        }
    }
    if (n0 > 0) ds41_batch_step(mine, n0);
    ds41_dist_dp_done(&e->ctx);
    for (int q = 1; q < N; q++)
        if (nb[q] && !(buf[q] = malloc(nb[q]))) oom();
    ds41_dist_dp_recv0((void *const *)buf, nb);
    /* the failed items' errors, from the ranks that had any */
    for (int q = 1; q < N; q++) at[q] = buf[q];
    for (int i = 0; i < count; i++) {
        int q = m->own[slot[i]];
        if (q == 0) continue;
        ne[q] += answer_status(at[q]) ? ANSWER_ERR : 0;
        at[q] += answer_bytes(&it[i], m->samp[slot[i]], V);
    }
    for (int q = 1; q < N; q++) {
        m->dpc.ans_bytes += (long long)(nb[q] + ne[q]);
        if (ne[q] && !(ebuf[q] = malloc(ne[q]))) oom();
    }
    ds41_dist_dp_recv0((void *const *)ebuf, ne);
    for (int q = 1; q < N; q++) {
        at[q] = buf[q];
        eat[q] = ebuf[q];
    }
    for (int i = 0, j = 0; i < count; i++) {
        int q = m->own[slot[i]];
        if (q == 0) { it[i] = mine[j++]; continue; }
        char eb[ANSWER_ERR];
        const char *err = NULL;
        if (answer_status(at[q])) {
            memcpy(eb, eat[q], ANSWER_ERR);
            eb[ANSWER_ERR - 1] = 0;
            eat[q] += ANSWER_ERR;
            err = eb[0] ? eb : "the step failed on the rank that holds the sequence";
        }
        at[q] = answer_take(m, slot[i], at[q], &it[i], V, err);
    }
    for (int q = 1; q < N; q++) { free(buf[q]); free(ebuf[q]); }
    free(at); free(eat); free(buf); free(ebuf); free(nb); free(ne); free(slot); free(mine);
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
    if (!m || m->ended) return;   /* once (a prefill node ends it itself, serve_pd.c) */
    m->ended = 1;
    dp_report(&m->dpc);
    if (m->store && !m->dp && verbose())
        fprintf(stderr, "ds41 serve [rank 0]: --cache-dir: %lld blocks read from the store sent to the other ranks (%lld bytes)\n",
                m->shipped_blocks, m->shipped_bytes);
    if (m->installs && verbose())
        fprintf(stderr, "ds41 serve [rank 0]: --role decode: %lld remote prefills installed %s (INSTALL, %lld bytes "
                        "of pages and state)\n", m->installs, m->dp ? "by their owners" : "on every rank", m->install_bytes);
    if (m->pd_forwards && verbose())
        fprintf(stderr, "ds41 serve [rank 0]: --role prefill: %lld prefill forwards run on every rank (PD_FWD)\n", m->pd_forwards);
    put1(m, DS41_SOP_END);
    flush(m);
}

/* ---------------------------------------------------------------- followers */

/* A session's image positions (IMAGES): flags[n], content keys [n][32] at the flagged
 * positions, embeddings [n][dim] (until the prompt is in: then NULL) */
typedef struct fimage {
    uint8_t *flags, *key;
    float *emb;
    size_t n;
} fimage;

static void fimage_free(fimage *fi) {
    if (!fi) return;
    free(fi->flags); free(fi->key); free(fi->emb);
    free(fi);
}

/* The flags and content keys of an IMAGES or PROBE_IMG record as ds41_prefix_img holds them
 * (emb NULL): a new fimage, NULL when out of memory. */
static fimage *fimage_keys(const ds41_sop *op) {
    fimage *fi = calloc(1, sizeof *fi);
    if (!fi) return NULL;
    fi->n = op->n;
    fi->flags = malloc(op->n);
    fi->key = calloc(op->n, 32);
    if (!fi->flags || !fi->key) { fimage_free(fi); return NULL; }
    for (size_t j = 0, r = 0; j < op->n; j++) {
        fi->flags[j] = (uint8_t)op->flags[j];
        if (fi->flags[j]) memcpy(fi->key + j * 32, op->keys + r++ * 8, 32);
    }
    return fi;
}

static ds41_prefix_img fimage_pim(const fimage *fi) {
    ds41_prefix_img pim = { fi->flags, fi->key, fi->emb, fi->n };
    return pim;
}

/* The sequences rank 0 opened: s is this rank's session, NULL for one another rank holds
 * (--dp-attention) */
typedef struct fslots {
    ds41_session **s;
    fimage **img;                 /* the session's image positions (IMAGES), NULL: a text prompt */
    int32_t *id;
    int *samp;                    /* --dp-attention: this rank samples the session (SAMP_*, SAMPLE) */
    ds41_lproc **lp;              /* --dp-attention: its logits processor (LPROC; NULL: none) */
    int n, cap;
    unsigned char *ans;           /* --dp-attention: this rank's answers to a step */
    size_t ans_cap;
    int *step_os;                 /* the step's items: samp of each */
    size_t step_cap;
    char *errs;                   /* the errors of the step's failed items */
    size_t errs_cap;
    int32_t *out;                 /* --spec: the verify blocks' outputs of a step (under --dp-attention: this rank's answers) */
    size_t out_cap;
    float *olg;                   /* --dp-attention: the rows of this rank's verify blocks whose logprobs rank 0 asked for */
    size_t olg_cap;
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

/* the logits processor this rank keeps for its session s (NULL: none) */
static ds41_lproc *lp_of(const fslots *f, const ds41_session *s) {
    for (int i = 0; i < f->n; i++)
        if (f->s[i] == s) return f->lp[i];
    return NULL;
}

static void lp_drop(ds41_lproc *lp) {
    if (!lp) return;
    ds41_lproc_free(lp);
    free(lp);
}

/* LPROC: the owner's processor for s, as rank 0 built it (ds41_smirror_sampling); 0 or -1 */
static int lp_build(ds41_engine *e, fslots *f, int slot, const ds41_sop *op, char *err, size_t errcap) {
    int V = ds41_vocab_size(e);
    if (op->eos >= V) return snprintf(err, errcap, "serve mirror: LPROC: eos %d outside the vocabulary of %d", op->eos, V), -1;
    if (op->think_end >= V)
        return snprintf(err, errcap, "serve mirror: LPROC: reasoning end %d outside the vocabulary of %d", op->think_end, V), -1;
    for (int k = 0; k < op->n_bias; k++)
        if (op->bias_id[k] >= V) return snprintf(err, errcap, "serve mirror: LPROC: a bias on token %d, outside the vocabulary of %d", (int)op->bias_id[k], V), -1;
    ds41_lproc *lp = calloc(1, sizeof *lp);
    if (!lp) return snprintf(err, errcap, "out of memory"), -1;
    ds41_lproc_init(lp, V, op->eos);
    lp->freq = op->freq;
    lp->pres = op->pres;
    lp->rep = op->rep;
    lp->min_tokens = op->min_tokens;
    ds41_lproc_think_budget(lp, op->think_end, op->think_budget);
    lp->bias_id = malloc(((size_t)op->n_bias + 1) * sizeof *lp->bias_id);
    lp->bias_val = malloc(((size_t)op->n_bias + 1) * sizeof *lp->bias_val);
    lp->ban_ids = malloc(((size_t)op->n_ban + 1) * sizeof *lp->ban_ids);
    int bad = !lp->bias_id || !lp->bias_val || !lp->ban_ids;
    if (!bad) {
        lp->n_bias = op->n_bias;
        memcpy(lp->bias_id, op->bias_id, (size_t)op->n_bias * sizeof *lp->bias_id);
        memcpy(lp->bias_val, op->bias_val, (size_t)op->n_bias * sizeof *lp->bias_val);   /* float bits */
        lp->n_ban = op->n_ban;
        memcpy(lp->ban_ids, op->ban, (size_t)op->n_ban * sizeof *lp->ban_ids);
    }
    if (bad || ds41_lproc_ready(lp) || ds41_lproc_prompt(lp, op->ids, op->n) || ds41_session_set_lproc(f->s[slot], lp)) {
        lp_drop(lp);
        return snprintf(err, errcap, "out of memory for a logits processor"), -1;
    }
    lp_drop(f->lp[slot]);
    f->lp[slot] = lp;
    return 0;
}

/* --dp-attention: this rank's items of the step (the others' are theirs), run; then the
 * exchanges of the other ranks' forwards, then the answers to rank 0 */
static int grow_buf(void *pp, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    void *p = realloc(*(void **)pp, n);
    if (!p) return -1;
    *(void **)pp = p;
    *cap = n;
    return 0;
}

static int step_own(ds41_engine *e, fslots *f, ds41_batch_item *items, int count, char *err, size_t errcap) {
    int n = 0, V = ds41_vocab_size(e);
    size_t bytes = 0;
    for (int k = 0; k < count; k++)
        if (items[k].s) {
            f->step_os[n] = f->step_os[k];
            f->dpc.verifies += items[k].verify;
            f->dpc.lp_verifies += items[k].verify && lp_of(f, items[k].s);
            f->dpc.g_verifies += items[k].verify && lp_of(f, items[k].s) && lp_of(f, items[k].s)->remote;
            items[n++] = items[k];
            bytes += answer_bytes(&items[k], f->step_os[k], V);
        }
    if (n > 0) ds41_batch_step(items, n);   /* per-item failures go to rank 0 in the answers */
    ds41_dist_dp_done(&e->ctx);
    if (!n) return 0;
    dp_measure(&f->dpc, f->s, NULL, f->n, 0);
    if (grow_buf(&f->ans, &f->ans_cap, bytes) || grow_buf(&f->errs, &f->errs_cap, (size_t)n * ANSWER_ERR))
        return snprintf(err, errcap, "out of memory for the answers of a step"), -1;
    unsigned char *p = f->ans;
    size_t ne = 0;
    for (int k = 0; k < n; k++) {
        p = answer_put(p, &items[k], lp_of(f, items[k].s), f->step_os[k], V);
        const char *ie = ds41_session_error(items[k].s);
        if (ie && ie[0]) snprintf(f->errs + ANSWER_ERR * ne++, ANSWER_ERR, "%s", ie);
    }
    ds41_dist_dp_send0(f->ans, bytes);
    ds41_dist_dp_send0(f->errs, ne * ANSWER_ERR);
    return 0;
}

/* --dp-attention: this rank's answer to a RESTORE of its session s (ds41_smirror_restore) */
static void restore_answer(ds41_engine *e, ds41_session *s, ds41_lproc *lp, int samp, long long hit, size_t n) {
    int64_t h = hit;
    ds41_dist_dp_send0(&h, sizeof h);
    if (hit < 0) {
        char eb[ANSWER_ERR] = { 0 };
        snprintf(eb, sizeof eb, "%s", ds41_session_error(s));
        ds41_dist_dp_send0(eb, sizeof eb);
    } else if (hit > 0 && (size_t)hit == n && samp != SAMP_RANK0) {
        unsigned char *tk = malloc(token_bytes(samp));
        if (!tk) ds41_dist_fatal(1, "out of memory for the answer to a restore");
        token_put(tk, s, lp, samp, 0, ds41_vocab_size(e));
        ds41_dist_dp_send0(tk, token_bytes(samp));
        free(tk);
    } else if (hit > 0 && (size_t)hit == n) {
        ds41_dist_dp_send0(ds41_logits(s), (size_t)ds41_vocab_size(e) * sizeof(float));
    }
}

/* --dp-attention: this rank's answer to the proposal of its session s (draft_answer_bytes(B)
 * bytes at a, zeroed) */
static void draft_fill(unsigned char *a, ds41_session *s, int rc, const int32_t *ids, const float *conf, int B) {
    int32_t st = rc != 0;
    memcpy(a, &st, sizeof st);
    if (!st) {
        memcpy(a + sizeof st, ids, (size_t)B * sizeof *ids);
        memcpy(a + sizeof st + (size_t)B * sizeof *ids, conf, (size_t)B * sizeof *conf);
    } else {
        snprintf((char *)a + draft_answer_bytes(B) - ANSWER_ERR, ANSWER_ERR, "%s", ds41_session_error(s));
    }
}

/* --dp-attention: this rank's answer to a DRAFT of its session s (ds41_smirror_propose) */
static void draft_answer(ds41_session *s, int rc, const int32_t *ids, const float *conf, int B) {
    size_t nb = draft_answer_bytes(B);
    unsigned char *a = calloc(1, nb);
    if (!a) ds41_dist_fatal(1, "out of memory for the answer to a proposal");
    draft_fill(a, s, rc, ids, conf, B);
    ds41_dist_dp_send0(a, nb);
    free(a);
}

static int apply(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp, fslots *f, const ds41_sop *op,
                 ds41_batch_item **items, int *items_cap, char *err, size_t errcap) {
    ds41_session *s = NULL;
    int dp = ds41_dist_dp(), me = ds41_dist_rank();
    if (op->op == DS41_SOP_CLOSE || op->op == DS41_SOP_RESTORE || op->op == DS41_SOP_PUBLISH || op->op == DS41_SOP_SAMPLE) {
        s = slot_find(f, op->id);
        if (!s && !(dp && slot_at(f, op->id) >= 0))
            return snprintf(err, errcap, "serve mirror: rank 0 named session %d, which this rank does not hold", (int)op->id), -1;
    }
    if ((op->op == DS41_SOP_OPEN || op->op == DS41_SOP_OPEN_ON) && (op->op == DS41_SOP_OPEN_ON) != dp)
        return snprintf(err, errcap, "serve mirror: rank 0 sent %s, this rank runs %s", op->op == DS41_SOP_OPEN_ON ? "OPEN_ON" : "OPEN",
                        dp ? "--dp-attention" : "without --dp-attention"), -1;
    if (op->op == DS41_SOP_OPEN_ON && op->rank >= ds41_dist_size())
        return snprintf(err, errcap, "serve mirror: rank 0 gave session %d to rank %d of %d", (int)op->id, op->rank, ds41_dist_size()), -1;
    if ((op->op == DS41_SOP_SAMPLE || op->op == DS41_SOP_PROBE || op->op == DS41_SOP_PROBE_IMG || op->op == DS41_SOP_LPROC ||
         op->op == DS41_SOP_GMASK || op->op == DS41_SOP_GRAMMAR || op->op == DS41_SOP_VMASK) && !dp)
        return snprintf(err, errcap, "serve mirror: rank 0 sent %s, which only --dp-attention uses",
                        op->op == DS41_SOP_SAMPLE ? "SAMPLE" : op->op == DS41_SOP_PROBE ? "PROBE"
                                                             : op->op == DS41_SOP_LPROC ? "LPROC"
                                                             : op->op == DS41_SOP_GMASK ? "GMASK"
                                                             : op->op == DS41_SOP_VMASK ? "VMASK"
                                                             : op->op == DS41_SOP_GRAMMAR ? "GRAMMAR" : "PROBE_IMG"), -1;
    if ((op->op == DS41_SOP_LPROC || op->op == DS41_SOP_GMASK || op->op == DS41_SOP_GRAMMAR || op->op == DS41_SOP_VMASK) &&
        slot_at(f, op->id) < 0)
        return snprintf(err, errcap, "serve mirror: rank 0 named session %d, which this rank does not hold", (int)op->id), -1;
    if (op->op == DS41_SOP_IMAGES && !(s = slot_find(f, op->id)) && !(dp && slot_at(f, op->id) >= 0))
        return snprintf(err, errcap, "serve mirror: rank 0 sends the image rows of session %d, which this rank does not hold",
                        (int)op->id), -1;
    if (op->op == DS41_SOP_DRAFT && !(s = slot_find(f, op->id)) && !(dp && slot_at(f, op->id) >= 0))
        return snprintf(err, errcap, "serve mirror: rank 0 drafts for session %d, which this rank does not hold", (int)op->id), -1;
    if (op->op == DS41_SOP_BLOCKS && dp)
        return snprintf(err, errcap, "serve mirror: rank 0 sent BLOCKS under --dp-attention, where each rank reads its own store"), -1;
    if (op->op == DS41_SOP_BLOCKS && !(s = slot_find(f, op->id)))
        return snprintf(err, errcap, "serve mirror: rank 0 sent the stored blocks of session %d, which this rank does not hold",
                        (int)op->id), -1;
    if ((op->op == DS41_SOP_PD_SEQ || op->op == DS41_SOP_PD_FWD) && (dp || !(s = slot_find(f, op->id))))
        return snprintf(err, errcap, "serve mirror: rank 0 sent %s for session %d, %s", op->op == DS41_SOP_PD_SEQ ? "PD_SEQ" : "PD_FWD",
                        (int)op->id, dp ? "under --dp-attention, which --role prefill does not run" : "which this rank does not hold"), -1;
    if (op->op == DS41_SOP_INSTALL && !(s = slot_find(f, op->id)) && !(dp && slot_at(f, op->id) >= 0))
        return snprintf(err, errcap, "serve mirror: rank 0 installs a remote prefill into session %d, which this rank does not hold",
                        (int)op->id), -1;
    if ((op->op == DS41_SOP_RESTORE || op->op == DS41_SOP_PUBLISH || op->op == DS41_SOP_TRIM || op->op == DS41_SOP_PROBE ||
         op->op == DS41_SOP_PROBE_IMG || op->op == DS41_SOP_BLOCKS || op->op == DS41_SOP_INSTALL) && !pc)
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
            int *no = realloc(f->samp, (size_t)nc * sizeof *no);
            if (!no) return snprintf(err, errcap, "out of memory"), -1;
            f->samp = no;
            ds41_lproc **nl = realloc(f->lp, (size_t)nc * sizeof *nl);
            if (!nl) return snprintf(err, errcap, "out of memory"), -1;
            f->lp = nl;
            fimage **nim = realloc(f->img, (size_t)nc * sizeof *nim);
            if (!nim) return snprintf(err, errcap, "out of memory"), -1;
            f->img = nim;
            f->cap = nc;
        }
        char eb[512];
        ds41_session *ns = NULL;
        if (op->op == DS41_SOP_OPEN || op->rank == me) {
            ns = ds41_session_open(e, sp, eb, sizeof eb);
            if (!ns) return snprintf(err, errcap, "serve mirror: cannot open a session as rank 0 did: %s", eb), -1;
        }
        f->s[f->n] = ns;
        f->img[f->n] = NULL;
        f->samp[f->n] = SAMP_RANK0;
        f->lp[f->n] = NULL;
        f->id[f->n++] = op->id;
        f->dpc.seqs += ns != NULL;
        return 0;
    }
    case DS41_SOP_CLOSE:
        ds41_session_close(s);
        for (int i = 0; i < f->n; i++)
            if (f->id[i] == op->id) {
                lp_drop(f->lp[i]);   /* after the session that pointed at it */
                fimage_free(f->img[i]);
                f->img[i] = f->img[f->n - 1];
                f->s[i] = f->s[--f->n];
                f->id[i] = f->id[f->n];
                f->samp[i] = f->samp[f->n];
                f->lp[i] = f->lp[f->n];
                break;
            }
        return 0;
    case DS41_SOP_SAMPLE:
        if (s) {
            ds41_session_set_sampling(s, op->temperature, op->top_k, op->top_p, op->min_p, op->seed);
            f->samp[slot_at(f, op->id)] = op->n_top < 0 ? SAMP_OWNER : SAMP_OWNER_LP + op->n_top;
        }
        return 0;
    case DS41_SOP_LPROC: {
        int j = slot_at(f, op->id);
        if (j >= 0 && f->s[j] && f->samp[j] == SAMP_RANK0)
            return snprintf(err, errcap, "serve mirror: rank 0 sent the logits processor of session %d before its sampler", (int)op->id), -1;
        return j >= 0 && f->s[j] ? lp_build(e, f, j, op, err, errcap) : 0;
    }
    case DS41_SOP_GRAMMAR: {
        /* the sequence's grammar stays on rank 0, which sends the allowed tokens of each row
         * this rank samples (GMASK) and of each row of a block it verifies (VMASK) */
        int j = slot_at(f, op->id);
        if (!f->s[j]) return 0;
        ds41_lproc *lp = f->lp[j];
        if (!lp) return snprintf(err, errcap, "serve mirror: rank 0 sent the grammar of session %d before its logits processor", (int)op->id), -1;
        lp->remote = 1;
        lp->xset = -1;
        if (ds41_lproc_ready(lp)) return snprintf(err, errcap, "out of memory for a grammar's allowed tokens"), -1;
        return 0;
    }
    case DS41_SOP_GMASK: {
        int j = slot_at(f, op->id);
        if (!f->s[j]) return 0;   /* another rank's sequence */
        ds41_lproc *lp = f->lp[j];
        size_t W = ((size_t)ds41_vocab_size(e) + 31) / 32;
        if (!lp || !lp->remote)
            return snprintf(err, errcap, "serve mirror: rank 0 sent the allowed tokens of session %d, which has no grammar here", (int)op->id), -1;
        if (op->on && op->n != W)
            return snprintf(err, errcap, "serve mirror: rank 0 sent %zu words of allowed tokens, this rank's vocabulary needs %zu", op->n, W), -1;
        if (op->on) memcpy(lp->bits, op->bits, W * sizeof *lp->bits);
        lp->xset = op->on;
        return 0;
    }
    case DS41_SOP_VMASK: {
        /* the allowed tokens of each row of the block the next step verifies (put_vmask) */
        int j = slot_at(f, op->id), V = ds41_vocab_size(e);
        if (!f->s[j]) return 0;   /* another rank's sequence */
        ds41_lproc *lp = f->lp[j];
        size_t W = ((size_t)V + 31) / 32;
        if (!lp || !lp->remote)
            return snprintf(err, errcap, "serve mirror: rank 0 sent the allowed tokens of a verify block of session %d, which has "
                                         "no grammar here", (int)op->id), -1;
        if (ds41_lproc_xrows(lp, (int)op->n)) return snprintf(err, errcap, "out of memory for a verify block's allowed tokens"), -1;
        const int32_t *w = op->bits;
        for (size_t k = 0; k < op->k; k++) {
            int r = w[0], form = w[1];
            size_t c = (size_t)w[2];
            uint32_t *b = lp->xbits + (size_t)r * W;
            w += 3;
            if (form == 1) {
                if (c != W)
                    return snprintf(err, errcap, "serve mirror: rank 0 sent %zu words of allowed tokens for row %d, this rank's "
                                                 "vocabulary needs %zu", c, r, W), -1;
                memcpy(b, w, W * sizeof *b);
            } else {
                memset(b, 0, W * sizeof *b);
                for (size_t t = 0; t < c; t++) {
                    if (w[t] >= V)
                        return snprintf(err, errcap, "serve mirror: rank 0 allowed token %d in row %d, outside this rank's "
                                                     "vocabulary of %d", (int)w[t], r, V), -1;
                    b[w[t] >> 5] |= 1u << (w[t] & 31);
                }
            }
            lp->xon[r] = 1;
            w += c;
        }
        return 0;
    }
    case DS41_SOP_PROBE: {
        uint8_t **pg = NULL;
        int64_t h = ds41_prefix_pages(pc, op->ids, op->n, &pg);
        ds41_prefix_pages_free(pc, pg, h);
        ds41_dist_dp_send0(&h, sizeof h);
        return 0;
    }
    case DS41_SOP_PROBE_IMG: {
        fimage *fi = fimage_keys(op);
        if (!fi) return snprintf(err, errcap, "out of memory"), -1;
        ds41_prefix_img pim = fimage_pim(fi);
        uint8_t **pg = NULL;
        int64_t h = ds41_prefix_pages_img(pc, op->ids, op->n, &pim, &pg);
        ds41_prefix_pages_free(pc, pg, h);
        fimage_free(fi);
        ds41_dist_dp_send0(&h, sizeof h);
        return 0;
    }
    case DS41_SOP_IMAGES: {
        if (op->dim != ds41_model_dim(e))
            return snprintf(err, errcap, "serve mirror: rank 0's image rows are %d wide, this rank's model %d", op->dim, ds41_model_dim(e)), -1;
        if (!s) return 0;   /* --dp-attention: another rank's sequence */
        fimage *fi = fimage_keys(op);
        if (fi && !(fi->emb = calloc(op->n * (size_t)op->dim, sizeof *fi->emb))) { fimage_free(fi); fi = NULL; }
        if (!fi) return snprintf(err, errcap, "out of memory for an image prompt's rows"), -1;
        for (size_t j = 0, r = 0; j < op->n; j++)
            if (fi->flags[j]) memcpy(fi->emb + j * (size_t)op->dim, op->rows + r++ * (size_t)op->dim, (size_t)op->dim * sizeof *fi->emb);
        int i = slot_at(f, op->id);
        fimage_free(f->img[i]);
        f->img[i] = fi;
        return 0;
    }
    case DS41_SOP_RESTORE: {
        int i = slot_at(f, op->id);
        ds41_prefix_img pim = f->img[i] ? fimage_pim(f->img[i]) : (ds41_prefix_img){ 0 };
        if (!dp) {
            /* a failure is rank 0's too: its session says so. --split layers with --cache-dir:
             * the stages agree on the blocks every stage's store holds (ds41_prefix_restore_job) */
            ds41_prefix_restore_job(pc, s, op->ids, op->n, f->img[i] ? &pim : NULL, ds41_pipe_on() && ds41_prefix_has_store(pc));
            return 0;
        }
        if (s && f->lp[i] && f->lp[i]->remote && f->lp[i]->xset < 0)
            return snprintf(err, errcap, "serve mirror: rank 0 restores session %d, which has a grammar, without its allowed "
                                         "tokens (GMASK)", (int)op->id), -1;
        long long hit = s ? ds41_prefix_restore_img(pc, s, op->ids, op->n, f->img[i] ? &pim : NULL) : 0;
        ds41_dist_dp_done(&e->ctx);   /* the owner's replay forward */
        if (s) restore_answer(e, s, f->lp[i], f->samp[i], hit, op->n);
        if (f->lp[i]) f->lp[i]->xset = -1;
        return 0;
    }
    case DS41_SOP_PUBLISH: {
        int i = slot_at(f, op->id);
        ds41_prefix_img pim = f->img[i] ? fimage_pim(f->img[i]) : (ds41_prefix_img){ 0 };
        if (s) ds41_prefix_publish_img(pc, s, op->ids, op->n, f->img[i] ? &pim : NULL);   /* under --dp-attention: the owner's cache */
        return 0;
    }
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
        if (!dp && ds41_pipe_stages(e->pipe) > 1) {
            /* --split layers: the last stage proposes and answers rank 0 (ds41_smirror_propose) */
            if (ds41_pipe_last(e->pipe)) {
                pipe_draft_answer(e, s, op->t_next, f->dids, f->dconf);
                f->dpc.props++;
            }
            return 0;
        }
        if (!dp) {
            ds41_session_draft(s, op->t_next, f->dids, f->dconf);   /* a failure is rank 0's too: it ends the sequence */
            return 0;
        }
        /* --dp-attention: the owner proposes and answers rank 0 (ds41_smirror_propose) */
        int rc = s ? ds41_session_draft(s, op->t_next, f->dids, f->dconf) : 0;
        f->dpc.props += s != NULL;
        ds41_dist_dp_done(&e->ctx);
        if (s) draft_answer(s, rc, f->dids, f->dconf, B);
        return 0;
    }
    case DS41_SOP_DRAFTS: {
        /* the sequences of the list this rank holds (replicated: all; --dp-attention: its own,
         * their forward rounds shared with the other ranks' proposals) in one batched proposal;
         * under --dp-attention then one answer to rank 0 for them all */
        int B = ds41_draft_block_size(e);
        int pipe = !dp && ds41_pipe_stages(e->pipe) > 1;   /* --split layers: the last stage proposes and answers */
        if (B < 1) return snprintf(err, errcap, "serve mirror: rank 0 drafts and this rank's model has no DSpark stages"), -1;
        size_t mine = 0, ab = draft_answer_bytes(B);
        for (size_t k = 0; k < op->n; k++) {
            if (slot_at(f, op->ids[2 * k]) < 0)
                return snprintf(err, errcap, "serve mirror: rank 0 drafts for session %d, which this rank does not hold",
                                (int)op->ids[2 * k]), -1;
            mine += slot_find(f, op->ids[2 * k]) != NULL;
        }
        if (!dp && mine != op->n)
            return snprintf(err, errcap, "serve mirror: rank 0 drafts for %zu sessions, of which this rank holds %zu", op->n,
                            mine), -1;
        if (pipe && !ds41_pipe_last(e->pipe)) return 0;
        char ceb[ANSWER_ERR] = { 0 };
        int crc = pipe ? pipe_draft_check(e, ceb, sizeof ceb) : 0;
        if (dp && grow_buf(&f->ans, &f->ans_cap, mine * ab))
            return snprintf(err, errcap, "out of memory for the answers to proposals"), -1;
        if (dp && mine) memset(f->ans, 0, mine * ab);
        /* this rank's in one batched proposal (ds41_session_draft_all), answered in order */
        if (mine) {
            ds41_session **ms = malloc(mine * sizeof *ms);
            int32_t *mt = malloc(mine * sizeof *mt), **mi = malloc(mine * sizeof *mi), *di = malloc(mine * B * sizeof *di);
            float **mc = malloc(mine * sizeof *mc), *dc = malloc(mine * B * sizeof *dc);
            int *mrc = malloc(mine * sizeof *mrc);
            if (!ms || !mt || !mi || !di || !mc || !dc || !mrc) {
                free(ms); free(mt); free(mi); free(di); free(mc); free(dc); free(mrc);
                return snprintf(err, errcap, "out of memory for %zu proposals", mine), -1;
            }
            size_t j = 0;
            for (size_t k = 0; k < op->n; k++) {
                ds41_session *ds = slot_find(f, op->ids[2 * k]);
                if (!ds) continue;
                ms[j] = ds, mt[j] = op->ids[2 * k + 1], mi[j] = di + j * B, mc[j] = dc + j * B;
                j++;
            }
            if (crc)
                for (j = 0; j < mine; j++) mrc[j] = -1;
            else
                ds41_session_draft_all((int)mine, ms, mt, 0, mi, mc, mrc);   /* replicated: a failure is rank 0's too */
            if (dp)
                for (j = 0; j < mine; j++) draft_fill(f->ans + j * ab, ms[j], mrc[j], mi[j], mc[j], B);
            if (pipe)
                for (j = 0; j < mine; j++) pipe_answer_send(e, mrc[j], crc ? ceb : ds41_session_error(ms[j]), mi[j], mc[j]);
            f->dpc.props += (long long)mine;
            f->dpc.batches++;
            free(ms); free(mt); free(mi); free(di); free(mc); free(dc); free(mrc);
        }
        if (!dp) return 0;
        ds41_dist_dp_done(&e->ctx);
        if (mine) ds41_dist_dp_send0(f->ans, mine * ab);
        return 0;
    }
    case DS41_SOP_CALIBRATE: {
        if (dp) {   /* rank 0's forwards alone: this rank joins their exchanges */
            ds41_dist_dp_done(&e->ctx);
            return 0;
        }
        ds41_spec_curve c;
        char eb[512];
        ds41_spec_calibrate(e, op->width, op->prompt_len, op->reps, &c, eb, sizeof eb);   /* rank 0 uses its own curve */
        return 0;
    }
    case DS41_SOP_BLOCKS: {
        int i = slot_at(f, op->id);
        ds41_prefix_img pim = f->img[i] ? fimage_pim(f->img[i]) : (ds41_prefix_img){ 0 };
        long long got = ds41_prefix_insert_bytes(pc, op->ids, op->n, f->img[i] ? &pim : NULL, op->first, op->nb, op->blk,
                                                 op->blk_len);
        if (got != op->nb)
            return snprintf(err, errcap, "serve mirror: rank 0's %d blocks from its store (%zu bytes) %s", op->nb, op->blk_len,
                            got < 0 ? "do not fit this rank's model" : "do not continue this rank's cached chain"), -1;
        return 0;
    }
    case DS41_SOP_INSTALL: {
        long long got = 0;
        if (s && ds41_serve_pd_follow_install(e, pc, s, op, &got, err, errcap)) return -1;
        if (!dp) return 0;
        /* --dp-attention: the owner installed (s held here); every rank joins its forward, and
         * the owner answers rank 0 with the tokens the session holds (0: refused) */
        ds41_dist_dp_done(&e->ctx);
        if (s) {
            int64_t h = got;
            ds41_dist_dp_send0(&h, sizeof h);
        }
        return 0;
    }
    case DS41_SOP_PD_SEQ: {
        ds41_seq *q = ds41_session_seq(s);
        if (op->stop >= e->cfg->n_layers)
            return snprintf(err, errcap, "serve mirror: PD_SEQ: layer %d (this rank's model has %d)", op->stop, e->cfg->n_layers), -1;
        q->prefill = DS41_PREFILL_CED;
        q->stop_layer = op->stop;
        if (pc) {   /* rank 0's hit query, for the same LRU order */
            uint8_t **pg = NULL;
            long long hb = ds41_prefix_pages(pc, op->ids, op->n, &pg);
            ds41_prefix_pages_free(pc, pg, hb);
        }
        return 0;
    }
    case DS41_SOP_PD_FWD: {
        ds41_seq *q = ds41_session_seq(s);
        if (ds41_session_pos(s) != op->at_pos)
            return snprintf(err, errcap, "serve mirror: PD_FWD of session %d from position %lld, which holds %lld tokens here",
                            (int)op->id, op->at_pos, ds41_session_pos(s)), -1;
        ds41_err fe;
        /* a failure is rank 0's too (the same forward): its request fails there */
        if (ds41_forward(q, op->ids + op->at_pos, (int)(op->n - (size_t)op->at_pos), 0, &fe))
            fprintf(stderr, "ds41 serve [rank %d]: a prefill forward failed: %s\n", me, fe.msg);
        return 0;
    }
    case DS41_SOP_STEP: {
        if (op->count > *items_cap) {
            ds41_batch_item *ni = realloc(*items, (size_t)op->count * sizeof *ni);
            if (!ni) return snprintf(err, errcap, "out of memory"), -1;
            *items = ni;
            *items_cap = op->count;
        }
        if (grow_buf(&f->step_os, &f->step_cap, (size_t)op->count * sizeof *f->step_os)) return snprintf(err, errcap, "out of memory"), -1;
        const int32_t *w = op->items;
        size_t nout = 0, nlg = 0;
        for (int k = 0, at = 0; k < op->count; k++) {
            if (op->items[at + 2] == DS41_SOP_VERIFY) {
                nout += (size_t)op->items[at + 1];
                int j = slot_at(f, op->items[at]);
                if (dp && j >= 0 && f->s[j] && f->samp[j] >= SAMP_OWNER_LP) nlg += (size_t)op->items[at + 1];
            }
            at += 3 + op->items[at + 1];
        }
        if (grow_buf(&f->olg, &f->olg_cap, nlg * (size_t)ds41_vocab_size(e) * sizeof *f->olg))
            return snprintf(err, errcap, "out of memory"), -1;
        if (nout > f->out_cap) {
            int32_t *no = realloc(f->out, nout * sizeof *no);
            if (!no) return snprintf(err, errcap, "out of memory"), -1;
            f->out = no;
            f->out_cap = nout;
        }
        nout = nlg = 0;
        for (int k = 0; k < op->count; k++) {
            ds41_batch_item *b = &(*items)[k];
            memset(b, 0, sizeof *b);
            b->s = slot_find(f, w[0]);
            f->step_os[k] = b->s ? f->samp[slot_at(f, w[0])] : SAMP_RANK0;
            if (!b->s && !(dp && slot_at(f, w[0]) >= 0))
                return snprintf(err, errcap, "serve mirror: rank 0's step names session %d, which this rank does not hold", (int)w[0]), -1;
            b->n = (size_t)w[1];
            b->ids = w + 3;
            const fimage *fi = b->s ? f->img[slot_at(f, w[0])] : NULL;
            long long pos = b->s ? ds41_session_pos(b->s) : 0;
            if (fi && fi->emb && w[2] != DS41_SOP_VERIFY && pos >= 0 && (size_t)pos + b->n <= fi->n) {
                /* prompt positions of an image prompt: their rows, as rank 0's item carries them */
                b->is_image = fi->flags + pos;
                b->emb = fi->emb + (size_t)pos * (size_t)ds41_model_dim(e);
            }
            if (w[2] == DS41_SOP_VERIFY) {
                if (b->s && dp && f->step_os[k] == SAMP_RANK0)
                    return snprintf(err, errcap, "serve mirror: rank 0's step verifies drafts of session %d, which rank 0 "
                                                 "samples and this rank holds", (int)w[0]), -1;
                b->verify = 1;
                b->out = f->out + nout;
                nout += b->n;
                if (b->s && dp && f->step_os[k] >= SAMP_OWNER_LP) {
                    b->out_logits = f->olg + nlg * (size_t)ds41_vocab_size(e);
                    nlg += b->n;
                }
            } else {
                b->ahead = (size_t)w[2];
            }
            const ds41_lproc *blp = b->s ? f->lp[slot_at(f, w[0])] : NULL;
            if (blp && blp->remote && b->verify && blp->xrows != (int)b->n)
                return snprintf(err, errcap, "serve mirror: rank 0's step verifies a block of %zu rows of session %d, whose grammar "
                                             "it holds, with the allowed tokens of %d rows (VMASK)", b->n, (int)w[0], blp->xrows), -1;
            if (blp && blp->remote && !b->verify && b->ahead == 0 && (blp->xset < 0 || blp->xrows > 0))
                return snprintf(err, errcap, "serve mirror: rank 0's step samples session %d, whose grammar it holds, without its "
                                             "allowed tokens (GMASK)", (int)w[0]), -1;
            w += 3 + b->n;
        }
        int rc = 0;
        if (dp) rc = step_own(e, f, *items, op->count, err, errcap);
        else {
            ds41_smirror_pipe_step(e, *items, op->count);   /* per-item failures are rank 0's too */
            for (int k = 0; k < op->count; k++) f->dpc.verifies += (*items)[k].verify != 0;
            dp_measure(&f->dpc, f->s, NULL, f->n, 0);
        }
        for (int i = 0; i < f->n; i++)   /* a prompt that is in: its rows are not read again */
            if (f->img[i] && f->img[i]->emb && f->s[i] && (size_t)ds41_session_pos(f->s[i]) >= f->img[i]->n) {
                free(f->img[i]->emb);
                f->img[i]->emb = NULL;
            }
        return rc;
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
    for (int i = 0; i < f.n; i++) {
        ds41_session_close(f.s[i]);
        lp_drop(f.lp[i]);
        fimage_free(f.img[i]);
    }
    ds41_spec_set_outcome_hook(NULL);
    free(f.s); free(f.img); free(f.id); free(f.samp); free(f.lp); free(f.ans); free(f.step_os); free(f.errs); free(f.out); free(f.olg); free(f.dids); free(f.dconf);
    free(items); free(buf);
    return rc;
}

/* ---------------------------------------------------------------- faults */

static ds41_sched *fault_sched;

static void on_fault(const char *msg) {
    /* the HTTP threads answer within a couple of seconds; the job ends after */
    if (fault_sched) ds41_sched_fail_all(fault_sched, msg, FAULT_ANSWER_S);
    /* rank 0 answered them itself: the guard must not add its own answer when the job ends */
    ds41_sguard_release();
}

void ds41_smirror_on_fault(ds41_sched *S) {
    fault_sched = S;
    ds41_dist_set_fault_hook(S ? on_fault : NULL);
}
