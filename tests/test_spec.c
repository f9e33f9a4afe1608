/* Speculative decoding (include/ds41.h ds41_spec_*, src/engine/spec.c, docs/speculative.md).
 * On the tiny random checkpoint (and, given as arguments by tests/spec.test.sh, the small43
 * production-plan checkpoint), exact kernels, both index-K readings:
 *   - forced drafts (all right / first right, second wrong / first wrong, ...): every emitted
 *     token and every logits row equals plain greedy decoding bit for bit, and after every
 *     verify the whole session digest (rings, compressor state, live KV / index-K records,
 *     entry and page counts, Engram history, logits, DSpark context row) equals that of a
 *     plain session that never saw the rejected tokens;
 *   - ds41_spec_step with the drafter's own proposals: same tokens and logits as plain greedy;
 *   - P5 metadata reuse on/off gives identical proposals (exact mode);
 *   - rejection sampling keeps the target distribution: chi-square of the joint of the first
 *     two tokens after a fixed t_next (drafts forced to likely tokens so both the accept and the
 *     residual paths run) against the exact filtered target probabilities;
 *   - the scheduler (spec 5.4) on hand-made confidences and curves. */
#include "check.h"
#include "testutil.h"
#include "ds41.h"
#include "spec.h"   /* the drafting gate's internals */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tiny[4096];

static int make_tiny(void) {
    const char *root = env_or("DS41_ROOT", "."), *build = env_or("DS41_BUILD", "build");
    const char *py = env_or("PYTHON", "/usr/bin/python3");
    if (build[0] == '/') snprintf(tiny, sizeof tiny, "%s/test-tmp/spec_tiny", build);
    else snprintf(tiny, sizeof tiny, "%s/%s/test-tmp/spec_tiny", root, build);
    char cmd[32768];   /* 5 paths of up to 4096 bytes + the text */
    snprintf(cmd, sizeof cmd, "[ -f '%s/.complete' ] || PYTHON='%s' bash '%s/tests/ckcache.sh' '%s' '%s/tests/configs/tiny' "
             "--seed 7 --token-map stub -q", tiny, py, root, tiny, root);
    return system(cmd);
}

static ds41_session *open_s(ds41_engine *e, int index_k, int reuse) {
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.draft = 1;
    sp.index_k = index_k;
    sp.no_meta_reuse = !reuse;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    CHECK(s, "session: %s", err);
    return s;
}

/* plain greedy: tok[i] and logits row i (the row tok[i] came from), digest after feeding tok[i] */
typedef struct plain { int n, V; int32_t *tok; float *lg; uint64_t *dig; } plain;

static void plain_run(ds41_engine *e, int index_k, const int32_t *prompt, int np, int n, plain *o) {
    int V = ds41_vocab_size(e);
    o->n = n; o->V = V;
    o->tok = calloc((size_t)n, sizeof(int32_t));
    o->lg = calloc((size_t)n * V, sizeof(float));
    o->dig = calloc((size_t)n + 1, sizeof(uint64_t));
    ds41_session *s = open_s(e, index_k, 1);
    if (!s) return;
    CHECK(ds41_feed(s, prompt, (size_t)np) == 0, "plain prefill: %s", ds41_session_error(s));
    o->dig[0] = ds41_session_digest(s);
    for (int i = 0; i < n; i++) {
        memcpy(o->lg + (size_t)i * V, ds41_logits(s), (size_t)V * sizeof(float));
        o->tok[i] = ds41_session_sample(s);
        CHECK(ds41_feed(s, &o->tok[i], 1) == 0, "plain feed: %s", ds41_session_error(s));
        o->dig[i + 1] = ds41_session_digest(s);
    }
    ds41_session_close(s);
}

static void plain_free(plain *o) { free(o->tok); free(o->lg); free(o->dig); }

/* forced drafts against a plain run: pattern p picks how many of the k drafts are right */
static void forced_one(ds41_engine *e, int index_k, int np, int n, unsigned seed, const char *what) {
    int V = ds41_vocab_size(e), B = ds41_draft_block_size(e);
    int32_t *prompt = malloc((size_t)np * sizeof(int32_t));
    rand_ids(prompt, np, V, seed);
    plain pr;
    plain_run(e, index_k, prompt, np, n + B + 2, &pr);
    ds41_session *s = open_s(e, index_k, 1);
    CHECK(ds41_feed(s, prompt, (size_t)np) == 0, "prefill");
    float *lg = malloc((size_t)(B + 2) * V * sizeof(float));
    int i = 0, step = 0, bad = 0;
    /* token i is the next to emit: t_next = tok[i] (emitted by us), then drafts */
    while (i + 1 + B < pr.n && i < n && !bad) {
        int k = B;
        if (index_k == DS41_INDEX_K_OFFICIAL && k > ds41_session_pos(s) - 1) k = (int)ds41_session_pos(s) - 1;
        int right = step % (k + 1);   /* 0..k right drafts, then a wrong one */
        int32_t d[64], out[66];
        for (int j = 0; j < k; j++) d[j] = pr.tok[i + 1 + j];
        if (right < k) d[right] = (d[right] + 1 + (int32_t)(step % 7)) % V;
        int A = -1;
        int m = ds41_spec_verify(s, pr.tok[i], d, k, out, lg, &A);
        CHECK(m == (right < k ? right : k) + 1, "%s: step %d: %d emitted, expected %d (%s)", what, step, m,
              (right < k ? right : k) + 1, ds41_session_error(s));
        if (m < 1) { bad = 1; break; }
        for (int j = 0; j < m; j++) {
            if (out[j] != pr.tok[i + 1 + j]) { CHECK(0, "%s: step %d token %d: %d vs plain %d", what, step, j, out[j], pr.tok[i + 1 + j]); bad = 1; }
            if (memcmp(lg + (size_t)j * V, pr.lg + (size_t)(i + 1 + j) * V, (size_t)V * sizeof(float))) {
                CHECK(0, "%s: step %d row %d: logits differ from plain decode", what, step, j);
                bad = 1;
            }
        }
        i += m;   /* tokens 0..i-1 emitted; tok[i] = pending, fed 0..i-1 */
        CHECK(ds41_spec_pending(s) == pr.tok[i], "%s: pending", what);
        CHECK(ds41_session_digest(s) == pr.dig[i], "%s: step %d (pos %lld, %d right of %d): state digest differs from "
              "a session that never saw the rejected tokens", what, step, ds41_session_pos(s), right, k);
        step++;
    }
    free(lg);
    free(prompt);
    plain_free(&pr);
    ds41_session_close(s);
}

static void natural_steps_k(ds41_engine *e, int index_k, int np, int n, unsigned seed, const char *what, int mode, int kk,
                            const ds41_spec_curve *cv, long long *proposals);
static void natural_steps(ds41_engine *e, int index_k, int np, int n, unsigned seed, const char *what) {
    natural_steps_k(e, index_k, np, n, seed, what, DS41_SPEC_FIXED, ds41_draft_block_size(e), NULL, NULL);
}
/* ds41_spec_step with the drafter's own proposals (mode, kk, curve cv) against plain greedy:
 * every token and logits row, the final digest; proposals (or NULL): steps that proposed */
static void natural_steps_k(ds41_engine *e, int index_k, int np, int n, unsigned seed, const char *what, int mode, int kk,
                            const ds41_spec_curve *cv, long long *proposals) {
    int V = ds41_vocab_size(e), B = ds41_draft_block_size(e);
    int32_t *prompt = malloc((size_t)np * sizeof(int32_t));
    rand_ids(prompt, np, V, seed);
    plain pr;
    plain_run(e, index_k, prompt, np, n + B + 2, &pr);
    ds41_session *s = open_s(e, index_k, 1);
    CHECK(ds41_feed(s, prompt, (size_t)np) == 0, "prefill");
    float *lg = malloc((size_t)(B + 2) * V * sizeof(float));
    ds41_spec_params p = { mode, kk, cv };
    ds41_spec_stats st;
    memset(&st, 0, sizeof st);
    int i = 0;
    if (proposals) *proposals = 0;
    while (i < n) {
        int32_t out[66];
        ds41_spec_step_info info;
        int m = ds41_spec_step(s, &p, out, B + 2, lg, &info, &st);
        CHECK(m >= 1, "%s: step: %s", what, ds41_session_error(s));
        if (m < 1) break;
        if (proposals) *proposals += info.proposal;
        CHECK(info.proposal || info.drafted == 0, "%s: drafts verified without a proposal", what);
        for (int j = 0; j < m && i + j < pr.n; j++) {
            CHECK(out[j] == pr.tok[i + j], "%s: token %d: %d vs %d", what, i + j, out[j], pr.tok[i + j]);
            CHECK(!memcmp(lg + (size_t)j * V, pr.lg + (size_t)(i + j) * V, (size_t)V * sizeof(float)),
                  "%s: logits of token %d differ", what, i + j);
        }
        i += m;
    }
    CHECK(st.drafted > 0 || kk == 0 || mode == DS41_SPEC_AUTO, "%s: nothing was drafted", what);
    CHECK(ds41_session_digest(s) == pr.dig[i - 1], "%s: final state differs from plain decoding", what);
    free(lg);
    free(prompt);
    plain_free(&pr);
    ds41_session_close(s);
}

static const char *cur_dir;
static int cur_n;

static void exact_forced_own(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    int W = 16, lens[] = { 2, 7, 20 };
    (void)W;
    for (int i = 0; i < 3; i++) forced_one(e, DS41_INDEX_K_OWN, lens[i], cur_n, 11 + i, "own");
    ds41_unload(e);
}
static void exact_forced_official(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    int lens[] = { 3, 8, 19 };
    for (int i = 0; i < 3; i++) forced_one(e, DS41_INDEX_K_OFFICIAL, lens[i], cur_n, 21 + i, "official");
    ds41_unload(e);
}
static void exact_steps_both(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    natural_steps(e, DS41_INDEX_K_OWN, 5, cur_n, 31, "own");
    natural_steps(e, DS41_INDEX_K_OFFICIAL, 6, cur_n, 32, "official");
    natural_steps_k(e, DS41_INDEX_K_OWN, 5, cur_n, 33, "own-k0", DS41_SPEC_FIXED, 0, NULL, NULL);
    natural_steps_k(e, DS41_INDEX_K_OFFICIAL, 4, cur_n, 34, "official-k1", DS41_SPEC_FIXED, 1, NULL, NULL);
    natural_steps_k(e, DS41_INDEX_K_OWN, 9, cur_n, 35, "own-auto", DS41_SPEC_AUTO, 0, NULL, NULL);
    /* a curve on which some steps take drafts and some not, the proposal cheap */
    ds41_spec_curve cv;
    memset(&cv, 0, sizeof cv);
    cv.n = 3; cv.sps[1] = 100; cv.sps[2] = 95; cv.sps[3] = 90;
    cv.propose_s = 1e-6; cv.draft_s = 1e-7;
    long long props = 0;
    natural_steps_k(e, DS41_INDEX_K_OWN, 9, cur_n, 36, "own-auto-curve", DS41_SPEC_AUTO, 0, &cv, &props);
    CHECK(props > 0, "a proposal of 1 us on a flat curve never ran");
    ds41_unload(e);
}

/* --spec auto when the proposal costs more than any gain: never a proposal, K = 0 every step,
 * the tokens, logits and final state of plain greedy decoding (exact mode) */
static void exact_auto_proposal_too_dear(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    ds41_spec_curve cv;
    memset(&cv, 0, sizeof cv);
    cv.n = 6;
    for (int w = 1; w <= 6; w++) cv.sps[w] = 1000.0;   /* verify rows free ... */
    cv.propose_s = 0.02;                               /* ... a proposal 20 decode steps */
    cv.draft_s = 0.0;
    long long props = -1;
    natural_steps_k(e, DS41_INDEX_K_OWN, 7, cur_n, 37, "auto-too-dear", DS41_SPEC_AUTO, 0, &cv, &props);
    CHECK(props == 0, "%lld proposals although none can pay", props);
    natural_steps_k(e, DS41_INDEX_K_OFFICIAL, 6, cur_n, 38, "auto-too-dear-official", DS41_SPEC_AUTO, 0, &cv, &props);
    CHECK(props == 0, "official: %lld proposals although none can pay", props);
    /* the lower level (ds41 chat / ds41 serve ask it before ds41_session_draft) */
    ds41_session *s = open_s(e, DS41_INDEX_K_OWN, 1);
    int32_t prompt[6];
    rand_ids(prompt, 6, ds41_vocab_size(e), 39);
    CHECK(ds41_feed(s, prompt, 6) == 0, "prefill");
    CHECK(ds41_spec_want_draft(s, &cv) == 0, "want_draft with a 20-step proposal");
    cv.propose_s = 1e-6;
    CHECK(ds41_spec_want_draft(s, &cv) == 1, "want_draft with a 1 us proposal on free verify rows");
    ds41_session_close(s);
    ds41_unload(e);
}

/* --spec auto defers the DSpark ring writes while its gate is dormant (session.c, dpend) and
 * writes them before the next proposal: the probe after 55 dormant steps (more than the
 * window, so the deferred rows wrap) proposes exactly what a session that seeded every step
 * proposes, and both end in the same state (exact mode) */
static void exact_dormant_rings(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    ds41_spec_curve cv;   /* the gate test's curve: the prior never pays, probes 55 steps apart */
    memset(&cv, 0, sizeof cv);
    cv.n = 6;
    for (int w = 1; w <= 6; w++) cv.sps[w] = 1000.0 / (1.0 + 0.2 * (w - 1));
    cv.propose_s = 0.5e-3;
    cv.draft_s = 0.05e-3;
    int V = ds41_vocab_size(e), B = ds41_draft_block_size(e);
    int32_t prompt[9];
    rand_ids(prompt, 9, V, 61);
    ds41_session *a = open_s(e, 0, 1), *b = open_s(e, 0, 1);
    CHECK(ds41_feed(a, prompt, 9) == 0 && ds41_feed(b, prompt, 9) == 0, "prefill");
    int probes = 0, first = -1, same = 1;
    for (int step = 0; step < 70 && a && b; step++) {
        int32_t t = ds41_session_sample(a), tb = ds41_session_sample(b);
        if (t != tb) { same = 0; break; }
        if (ds41_spec_want_draft(a, &cv)) {
            int32_t da[64], db[64];
            float ca[64], cb[64];
            CHECK(ds41_session_draft(a, t, da, ca) == 0 && ds41_session_draft(b, t, db, cb) == 0, "draft");
            if (memcmp(da, db, (size_t)B * 4) || memcmp(ca, cb, (size_t)B * 4)) same = 0;
            if (ds41_session_digest(a) != ds41_session_digest(b)) same = 0;
            if (!probes++) first = step;
        }
        if (ds41_feed(a, &t, 1) || ds41_feed(b, &t, 1)) { same = 0; break; }
    }
    CHECK(probes == 1 && first == 54, "probes %d, the first at step %d (expected 1 at 54)", probes, first);
    CHECK(same, "a dormant session's probe or state differs from seeding every step");
    CHECK(ds41_session_digest(a) == ds41_session_digest(b), "final state differs");
    ds41_session_close(a);
    ds41_session_close(b);
    ds41_unload(e);
}

/* long prompt across a page boundary (small43: 64 ratio-2 entries per page) */
static void exact_forced_page_boundary(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    forced_one(e, DS41_INDEX_K_OWN, 125, 6, 41, "page-own");
    forced_one(e, DS41_INDEX_K_OFFICIAL, 126, 6, 42, "page-official");
    ds41_unload(e);
}

static void meta_reuse_same_drafts(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    int V = ds41_vocab_size(e), B = ds41_draft_block_size(e);
    int32_t prompt[12];
    rand_ids(prompt, 12, V, 51);
    ds41_session *a = open_s(e, 0, 1), *b = open_s(e, 0, 0);
    CHECK(ds41_feed(a, prompt, 12) == 0 && ds41_feed(b, prompt, 12) == 0, "prefill");
    for (int step = 0; step < 6; step++) {
        int32_t t = ds41_session_sample(a), da[64], db[64];
        float ca[64], cb[64];
        CHECK(ds41_session_draft(a, t, da, ca) == 0 && ds41_session_draft(b, t, db, cb) == 0, "draft");
        CHECK(!memcmp(da, db, (size_t)B * 4) && !memcmp(ca, cb, (size_t)B * 4), "step %d: proposals differ with P5 reuse", step);
        CHECK(ds41_session_digest(a) == ds41_session_digest(b), "step %d: state differs with P5 reuse", step);
        ds41_feed(a, &t, 1);
        ds41_feed(b, &t, 1);
    }
    ds41_session_close(a);
    ds41_session_close(b);
    ds41_unload(e);
}

/* ds41_session_draft_all (the public batch): sessions a and b (other prompts; b without P5
 * reuse) beside c, opened without params.draft; the batch {a, c, b} gives a and b exactly what
 * ds41_session_draft gives their twins (drafts, confidences, and the state digest after), c its
 * own error, and does not hold a and b back; three steps. */
static void draft_all_public(void) {
    ds41_engine *e = load_checked(cur_dir, 1, 0);
    if (!e) return;
    int V = ds41_vocab_size(e), B = ds41_draft_block_size(e);
    int32_t pa[11], pb[17];
    rand_ids(pa, 11, V, 71);
    rand_ids(pb, 17, V, 72);
    ds41_session *a = open_s(e, 0, 1), *a2 = open_s(e, 0, 1), *b = open_s(e, 0, 0), *b2 = open_s(e, 0, 0);
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    char err[512];
    ds41_session *c = ds41_session_open(e, &sp, err, sizeof err);
    CHECK(a && a2 && b && b2 && c, "sessions");
    if (!(a && a2 && b && b2 && c)) return;
    CHECK(ds41_feed(a, pa, 11) == 0 && ds41_feed(a2, pa, 11) == 0 && ds41_feed(b, pb, 17) == 0 && ds41_feed(b2, pb, 17) == 0 &&
          ds41_feed(c, pa, 11) == 0, "prefill");
    int bad = 0;
    for (int step = 0; step < 3; step++) {
        int32_t ta = ds41_session_sample(a), tb = ds41_session_sample(b), da[64], db[64], dc[64], xa[64], xb[64];
        float ca[64], cb[64], cc[64], ya[64], yb[64];
        ds41_session *all[3] = { a, c, b };
        int32_t tn[3] = { ta, ta, tb }, *ids[3] = { da, dc, db };
        float *cf[3] = { ca, cc, cb };
        int rc[3] = { 9, 9, 9 };
        int nf = ds41_session_draft_all(3, all, tn, 0, ids, cf, rc);
        CHECK(nf == 1 && rc[0] == 0 && rc[1] == -1 && rc[2] == 0 && strstr(ds41_session_error(c), "without params.draft"),
              "step %d: %d failed, rc %d %d %d, c: %s", step, nf, rc[0], rc[1], rc[2], ds41_session_error(c));
        CHECK(ds41_session_draft(a2, ta, xa, ya) == 0 && ds41_session_draft(b2, tb, xb, yb) == 0, "twins' drafts");
        bad += memcmp(da, xa, (size_t)B * 4) || memcmp(ca, ya, (size_t)B * 4) || memcmp(db, xb, (size_t)B * 4) ||
               memcmp(cb, yb, (size_t)B * 4) || ds41_session_digest(a) != ds41_session_digest(a2) ||
               ds41_session_digest(b) != ds41_session_digest(b2);
        ds41_feed(a, &ta, 1); ds41_feed(a2, &ta, 1); ds41_feed(b, &tb, 1); ds41_feed(b2, &tb, 1);
    }
    CHECK(bad == 0, "%d of 3 steps: the batch's drafts or states differ from the twins'", bad);
    ds41_session_close(a); ds41_session_close(a2); ds41_session_close(b); ds41_session_close(b2); ds41_session_close(c);
    ds41_unload(e);
}

/* ---- sampling: chi-square of (x1, x2) after a fixed t_next ---- */
#define TOPK 4
static void topk_probs(const float *lg, int V, float temp, int *ids, double *p) {
    for (int k = 0; k < TOPK; k++) ids[k] = -1;
    for (int v = 0; v < V; v++) {
        int k = TOPK;
        while (k > 0 && (ids[k - 1] < 0 || lg[v] > lg[ids[k - 1]])) k--;
        if (k >= TOPK) continue;
        for (int j = TOPK - 1; j > k; j--) ids[j] = ids[j - 1];
        ids[k] = v;
    }
    double mx = lg[ids[0]] / temp, s = 0;
    for (int k = 0; k < TOPK; k++) { p[k] = exp(lg[ids[k]] / temp - mx); s += p[k]; }
    for (int k = 0; k < TOPK; k++) p[k] /= s;
}

static void sampling_chi_square(void) {
    ds41_engine *e = load_checked(tiny, 1, 0);
    if (!e) return;
    int V = ds41_vocab_size(e);
    const float temp = 1.5f;
    int32_t prompt[6];
    rand_ids(prompt, 6, V, 61);
    /* the exact joint from teacher-forced plain forwards */
    ds41_session *s = open_s(e, 0, 1);
    CHECK(ds41_feed(s, prompt, 6) == 0, "prefill");
    int32_t t0 = ds41_session_sample(s);   /* greedy */
    CHECK(ds41_feed(s, &t0, 1) == 0, "feed");
    int id1[TOPK], id2[TOPK][TOPK];
    double p1[TOPK], p2[TOPK][TOPK];
    topk_probs(ds41_logits(s), V, temp, id1, p1);
    for (int a = 0; a < TOPK; a++) {
        ds41_session_reset(s);
        int32_t seq[8];
        memcpy(seq, prompt, sizeof prompt);
        seq[6] = t0;
        seq[7] = id1[a];
        CHECK(ds41_feed(s, seq, 6) == 0 && ds41_feed(s, seq + 6, 1) == 0 && ds41_feed(s, seq + 7, 1) == 0, "feed");
        topk_probs(ds41_logits(s), V, temp, id2[a], p2[a]);
    }
    /* drafts: d1 = the most likely x1, d2 = the second most likely x2 after d1 */
    int32_t d[2] = { id1[0], id2[0][1] };
    const int N = 2000;
    long long cnt[TOPK][TOPK];
    memset(cnt, 0, sizeof cnt);
    long long acc1 = 0, acc2 = 0, other = 0;
    for (int r = 0; r < N; r++) {
        ds41_session_reset(s);
        ds41_session_set_sampling(s, temp, TOPK, 1.0f, 0.0f, 1000 + r);
        ds41_feed(s, prompt, 6);
        int32_t out[8], got[4];
        int ng = 0, A = 0;
        got[0] = got[1] = -1;
        int m = ds41_spec_verify(s, t0, d, 2, out, NULL, &A);
        CHECK(m >= 1, "verify: %s", ds41_session_error(s));
        if (m < 1) break;
        acc1 += A >= 1;
        acc2 += A >= 2;
        for (int j = 0; j < m && ng < 2; j++) got[ng++] = out[j];
        while (ng < 2) {
            int32_t pend = ds41_spec_pending(s);
            m = ds41_spec_verify(s, pend, NULL, 0, out, NULL, &A);
            if (m < 1) break;
            got[ng++] = out[0];
        }
        int a = -1, b = -1;
        for (int k = 0; k < TOPK; k++) if (id1[k] == got[0]) a = k;
        if (a >= 0) for (int k = 0; k < TOPK; k++) if (id2[a][k] == got[1]) b = k;
        if (a < 0 || b < 0) other++;
        else cnt[a][b]++;
    }
    CHECK(other == 0, "%lld samples outside the top-%d support", other, TOPK);
    double chi = 0;
    int cells = 0;
    for (int a = 0; a < TOPK; a++)
        for (int b = 0; b < TOPK; b++) {
            double ex = N * p1[a] * p2[a][b];
            if (ex < 1e-9) continue;
            chi += (cnt[a][b] - ex) * (cnt[a][b] - ex) / ex;
            cells++;
        }
    /* 16 cells, 15 degrees of freedom: P(chi2 > 37.70) = 0.001 */
    printf("  sampling: N %d, p(d1) %.3f, accepted d1 %lld, d1+d2 %lld, chi-square %.2f over %d cells (bound 37.70)\n",
           N, p1[0], acc1, acc2, chi, cells);
    CHECK(chi < 37.70, "chi-square %.2f >= 37.70 (df 15, p = 0.001)", chi);
    CHECK(acc1 > N / 10 && acc2 > 0, "the accept path barely ran (%lld, %lld)", acc1, acc2);
    ds41_session_close(s);
    ds41_unload(e);
}

static void scheduler(void) {
    ds41_spec_curve c;
    memset(&c, 0, sizeof c);
    c.n = 6;
    for (int w = 1; w <= 6; w++) c.sps[w] = 100.0 / (1.0 + 0.05 * (w - 1));   /* cheap widths */
    float conf[2][5] = { { 5, 5, 5, -5, -5 }, { -5, -5, -5, -5, -5 } };
    int ml[2] = { 5, 5 }, len[2];
    double tau = ds41_spec_schedule(&c, 2, 5, &conf[0][0], ml, len);
    CHECK(len[0] == 3 && len[1] == 0, "lengths %d %d (expected 3 0)", len[0], len[1]);
    CHECK(tau > 4.9 && tau < 5.0, "tau %f", tau);
    /* flat curve (memory-bound): every positive survival is worth verifying */
    for (int w = 1; w <= 6; w++) c.sps[w] = 100.0;
    ds41_spec_schedule(&c, 2, 5, &conf[0][0], ml, len);
    CHECK(len[0] == 5 && len[1] == 5, "flat: %d %d", len[0], len[1]);
    /* linear cost: nothing pays unless survival > tau / B */
    for (int w = 1; w <= 6; w++) c.sps[w] = 100.0 / w;
    ds41_spec_schedule(&c, 2, 5, &conf[0][0], ml, len);
    CHECK(len[0] == 0 && len[1] == 0, "linear: %d %d", len[0], len[1]);
    CHECK(fabs(ds41_spec_curve_sps(&c, 8) - 100.0 / 8) < 1e-9, "extrapolation %f", ds41_spec_curve_sps(&c, 8));
    int ml0 = 2;
    ds41_spec_schedule(NULL, 1, 5, &conf[0][0], &ml0, len);
    CHECK(len[0] == 2, "max_len respected: %d", len[0]);
}

/* The drafting gate (spec.h) on a hand-made curve: t(w) = 1 + 0.2 (w - 1) ms, a proposal
 * 0.5 ms + 0.05 ms per draft, so a step of K drafts takes 1.5 + 0.25 K ms; a plain step 1 ms
 * (1000 tokens/s). */
static void gate(void) {
    ds41_spec_curve c;
    memset(&c, 0, sizeof c);
    c.n = 6;
    for (int w = 1; w <= 6; w++) c.sps[w] = 1000.0 / (1.0 + 0.2 * (w - 1));
    c.propose_s = 0.5e-3;
    c.draft_s = 0.05e-3;
    int bk = -1;
    double th = ds41_spec_best_theta(&c, 5, NULL, &bk);
    /* always right: max over K of (1 + K) / (1.5 + 0.25 K) ms is K = 5, 6 / 2.75 ms */
    CHECK(bk == 5 && fabs(th - 6.0 / 2.75e-3) < 1e-6, "best case K %d, %.6f tokens/s", bk, th);
    CHECK(fabs(ds41_spec_step_time(&c, 1, 3, 1) - 2.0e-3) < 1e-12, "step time K = 2: %.9f", ds41_spec_step_time(&c, 1, 3, 1));
    CHECK(fabs(ds41_spec_step_time(&c, 1, 1, 0) - 1e-3) < 1e-12, "plain step time %.9f", ds41_spec_step_time(&c, 1, 1, 0));
    ds41_spec_state st;
    memset(&st, 0, sizeof st);
    st.probe_every = DS41_SPEC_PROBE_MIN;
    /* no history: the prior survivals 1/2, 1/4, ... give at best (1 + 0.5 + 0.25) / 2 ms
     * (K = 2) = 875 tokens/s < 1000: no proposal but the probes. A probe (0.5 + 0.05 ms) is
     * 0.55 of a plain step, so at most 1 % of the time (DS41_SPEC_PROBE_BUDGET) puts them 55
     * plain steps apart, then twice as far each time they fail: after 55, then 110 more */
    CHECK(fabs(ds41_spec_survival(&st, 0) - 0.5) < 1e-12 && fabs(ds41_spec_survival(&st, 1) - 0.25) < 1e-12,
          "prior survival %f %f", ds41_spec_survival(&st, 0), ds41_spec_survival(&st, 1));
    CHECK(ds41_spec_probe_floor(&c, 0) == 55 && ds41_spec_probe_floor(&c, 1) == 55, "probe floor %d (expected 55)",
          ds41_spec_probe_floor(&c, 0));
    int opens[4], n_open = 0, dormant_ok = 1;
    for (int i = 0; i < 200; i++) {
        int g = ds41_spec_gate(&st, &c, 5);
        dormant_ok &= st.dormant == !g;
        if (g && n_open < 4) opens[n_open++] = i;
    }
    CHECK(n_open == 2 && opens[0] == 54 && opens[1] == 164, "probes at %d steps: %d %d (expected 54 164)", n_open,
          n_open > 0 ? opens[0] : -1, n_open > 1 ? opens[1] : -1);
    CHECK(dormant_ok, "dormant flag = the gate said no");
    /* a probe also writes the ring rows its dormant spell deferred (flush_s: 1.45 ms for a
     * window of them, about what the demo model's 64 rows cost against its 0.45 ms decode
     * step): 0.55 + 1.45 = 2 plain steps, so the probes come 200 steps apart at least, then
     * 400: a generation shorter than 200 tokens pays for none */
    ds41_spec_curve cf = c;
    cf.flush_s = 1.45e-3;
    CHECK(ds41_spec_probe_floor(&cf, 0) == 200, "probe floor with the flush %d (expected 200)", ds41_spec_probe_floor(&cf, 0));
    ds41_spec_state sf;
    memset(&sf, 0, sizeof sf);
    sf.probe_every = DS41_SPEC_PROBE_MIN;
    n_open = 0;
    for (int i = 0; i < 700; i++)
        if (ds41_spec_gate(&sf, &cf, 5) && n_open < 4) opens[n_open++] = i;
    CHECK(n_open == 2 && opens[0] == 199 && opens[1] == 599, "probes with the flush at %d steps: %d %d (expected 199 599)",
          n_open, n_open > 0 ? opens[0] : -1, n_open > 1 ? opens[1] : -1);
    /* the flush counts in the probes' spacing only: drafting that pays still opens at once */
    for (int i = 0; i < 5; i++) ds41_spec_observe(&sf, 5, 5);
    CHECK(ds41_spec_gate(&sf, &cf, 5) == 1, "gate with the flush after acceptances");
    /* the session's first probe is cold (cold_s, its buffers new): 3 ms = 3 plain steps puts it
     * 300 steps in, the next one 600 later (twice the first's spacing, above the warm floor of
     * 200); a cold figure below the warm probe's changes nothing */
    cf.cold_s = 3e-3;
    CHECK(ds41_spec_probe_floor(&cf, 1) == 300 && ds41_spec_probe_floor(&cf, 0) == 200, "cold floors %d %d (300 200)",
          ds41_spec_probe_floor(&cf, 1), ds41_spec_probe_floor(&cf, 0));
    memset(&sf, 0, sizeof sf);
    sf.probe_every = DS41_SPEC_PROBE_MIN;
    n_open = 0;
    for (int i = 0; i < 1000; i++)
        if (ds41_spec_gate(&sf, &cf, 5) && n_open < 4) opens[n_open++] = i;
    CHECK(n_open == 2 && opens[0] == 299 && opens[1] == 899, "cold first probe at %d steps: %d %d (expected 299 899)",
          n_open, n_open > 0 ? opens[0] : -1, n_open > 1 ? opens[1] : -1);
    cf.cold_s = 1e-3;
    CHECK(ds41_spec_probe_floor(&cf, 1) == 200, "a cold figure below the warm probe's: %d", ds41_spec_probe_floor(&cf, 1));
    /* a curve without the proposal's cost: the old floor of 8 steps */
    ds41_spec_curve c0 = c;
    c0.propose_s = 0;
    CHECK(ds41_spec_probe_floor(&c0, 0) == DS41_SPEC_PROBE_MIN && ds41_spec_probe_floor(NULL, 1) == DS41_SPEC_PROBE_MIN,
          "probe floor without a proposal cost");
    /* five steps with every draft accepted: survival ~0.91 .. 0.87, Theta ~1980 > 1000 */
    for (int i = 0; i < 5; i++) ds41_spec_observe(&st, 5, 5);
    CHECK(ds41_spec_survival(&st, 0) > 0.9 && ds41_spec_survival(&st, 4) > 0.85, "survival %f %f",
          ds41_spec_survival(&st, 0), ds41_spec_survival(&st, 4));
    CHECK(ds41_spec_gate(&st, &c, 5) == 1 && st.probe_every == DS41_SPEC_PROBE_MIN, "gate after acceptances");
    /* then forty steps with nothing accepted: closed again */
    for (int i = 0; i < 40; i++) ds41_spec_observe(&st, 5, 0);
    CHECK(ds41_spec_survival(&st, 0) < 0.2, "survival after rejections %f", ds41_spec_survival(&st, 0));
    CHECK(ds41_spec_gate(&st, &c, 5) == 0, "gate after rejections");
    /* a proposal of 10 ms: even (1 + 5) / 12.25 ms = 490 tokens/s < 1000, whatever the
     * history: never a proposal, no probes */
    c.propose_s = 10e-3;
    for (int i = 0; i < 20; i++) ds41_spec_observe(&st, 5, 5);
    int opened = 0;
    for (int i = 0; i < 1000; i++) opened += ds41_spec_gate(&st, &c, 5);
    CHECK(opened == 0, "a 10 ms proposal opened the gate %d times", opened);
    /* without the proposal's cost (an older curve file): always propose, as before */
    c.propose_s = 0;
    CHECK(ds41_spec_gate(&st, &c, 5) == 1 && ds41_spec_gate(&st, NULL, 5) == 1, "gate without a proposal cost");
    CHECK(ds41_spec_gate(&st, &c, 0) == 0, "gate with no room for drafts");
}

/* The curve file: the widths, then propose_s / draft_s; a file without propose_s (the older
 * format) is refused so that the caller re-measures */
static void curve_file(void) {
    const char *build = env_or("DS41_BUILD", "build");
    char path[4200];
    snprintf(path, sizeof path, "%s/test-tmp/spec_curve_%d.txt", build, (int)getpid());
    ds41_spec_curve c, r;
    memset(&c, 0, sizeof c);
    c.n = 3; c.sps[1] = 1000.5; c.sps[2] = 600.25; c.sps[3] = 450.125;
    c.propose_s = 0.000612345; c.draft_s = 0.000078125; c.flush_s = 0.000901234; c.cold_s = 0.002345678;
    CHECK(ds41_spec_curve_save(path, &c) == 0, "save %s", path);
    CHECK(ds41_spec_curve_load(path, &r) == 0, "load");
    CHECK(r.n == 3 && r.sps[1] == 1000.5 && r.sps[2] == 600.25 && r.sps[3] == 450.125 && r.propose_s == 0.000612345 &&
          r.draft_s == 0.000078125 && r.flush_s == 0.000901234 && r.cold_s == 0.002345678,
          "round trip: n %d, %f %f %f, %.9f %.9f %.9f %.9f", r.n, r.sps[1], r.sps[2], r.sps[3], r.propose_s, r.draft_s,
          r.flush_s, r.cold_s);
    FILE *f = fopen(path, "w");
    if (f) { fputs("1 1000.0\n2 600.0\n", f); fclose(f); }
    CHECK(ds41_spec_curve_load(path, &r) == -1 && r.n == 0, "an old-format file (no propose_s) loaded");
    f = fopen(path, "w");
    if (f) { fputs("1 1000.0\n2 600.0\npropose_s 0.0005\ndraft_s 0.00005\nlater_key 3\n", f); fclose(f); }
    CHECK(ds41_spec_curve_load(path, &r) == 0 && r.n == 2 && r.propose_s == 0.0005 && r.flush_s == 0 && r.cold_s == 0,
          "a file with an unknown key and no flush_s / cold_s (not counted)");
    /* the cache names a format: a curve cached before flush_s was measured is measured again */
    char p1[4096], p2[4096];
    const char *saved = getenv("DS41_SPEC_CURVE");
    char *keep = saved ? strdup(saved) : NULL, *keep_xdg = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    unsetenv("DS41_SPEC_CURVE");
    setenv("XDG_CACHE_HOME", "/nonexistent-ds41-cache", 1);
    CHECK(ds41_spec_curve_path("/nonexistent-model", 1, 0, p1, sizeof p1) == 0 &&
          ds41_spec_curve_path("/nonexistent-model", 2, 1, p2, sizeof p2) == 0, "cache paths");
    /* FNV-1a of the old key (the directory alone, no config.json there): 64 bits after 'spec-curve-' */
    uint64_t h = 0xcbf29ce484222325ULL;
    h = ds41_digest_bytes(h, "/nonexistent-model", strlen("/nonexistent-model"));
    char old_name[128];
    snprintf(old_name, sizeof old_name, "spec-curve-%016llx-t1-fast.txt", (unsigned long long)h);
    CHECK(strstr(p1, "/nonexistent-ds41-cache/ds41/spec-curve-") == p1 && !strstr(p1, old_name) &&
          strstr(p1, "-t1-fast.txt") && strstr(p2, "-t2-exact.txt"), "cache path %s (old name %s)", p1, old_name);
    if (keep) { setenv("DS41_SPEC_CURVE", keep, 1); free(keep); }
    if (keep_xdg) { setenv("XDG_CACHE_HOME", keep_xdg, 1); free(keep_xdg); }
    else unsetenv("XDG_CACHE_HOME");
    f = fopen(path, "w");
    if (f) { fputs("1 1000.0\n3 600.0\npropose_s 0.0005\n", f); fclose(f); }
    CHECK(ds41_spec_curve_load(path, &r) == -1, "a width skipped");
    remove(path);
}

int main(int argc, char **argv) {
    if (make_tiny()) { printf("FAIL spec_checkpoint: make_checkpoint.py failed\n"); return 1; }
    RUN_CASE(scheduler);
    RUN_CASE(gate);
    RUN_CASE(curve_file);
    cur_dir = tiny;
    cur_n = 24;
    if (argc < 2) {
        RUN_CASE(exact_forced_own);
        RUN_CASE(exact_forced_official);
        RUN_CASE(exact_steps_both);
        RUN_CASE(exact_auto_proposal_too_dear);
        RUN_CASE(exact_dormant_rings);
        RUN_CASE(meta_reuse_same_drafts);
        RUN_CASE(draft_all_public);
        RUN_CASE(sampling_chi_square);
    }
    for (int a = 1; a < argc; a++) {   /* further checkpoints (tests/spec.test.sh: small43) */
        cur_dir = argv[a];
        cur_n = 10;
        printf("  checkpoint %s\n", cur_dir);
        RUN_CASE(exact_forced_own);
        RUN_CASE(exact_forced_official);
        RUN_CASE(exact_steps_both);
        RUN_CASE(exact_forced_page_boundary);
        RUN_CASE(meta_reuse_same_drafts);
    }
    return check_exit();
}
