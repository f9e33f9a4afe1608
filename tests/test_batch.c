/* The batched engine step (ds41_batch_step -> ds41_forward_batch, src/engine/forward.c): decode
 * rows and speculative verify blocks of many sessions in one forward, prefill chunks one at a
 * time in the same call.
 *
 * Every case runs B pairs of sessions in lockstep: the batched session of each pair is stepped
 * by ds41_batch_step together with the B - 1 others, its twin alone by ds41_feed /
 * ds41_spec_verify (the single-sequence forward). Sequences differ in prompt and length
 * (shorter and longer than the window, so rings wrap at different slots and compressors sit in
 * different group phases). After every step each pair must agree bit for bit: the logits
 * (memcmp), every verify output (emitted ids, accepted count, logits rows), the pending token,
 * and the whole-state digest (ds41_session_digest: rings, compressor state, KV / index-K
 * records, pages, Engram history, logits, DSpark context row).
 *   exact kernels: bit-identical to running alone (each row is computed independently);
 *   fast kernels: the same equality, i.e. batch invariance (a row's bits do not depend on
 *   what else is in the batch or on its size; kernels/linear_fast.c's canonical order).
 * Cases: decode-only batches and decode + verify mixes (drafts from the sequence's greedy
 * continuation, some corrupted so that acceptance stops at different places) of 1, 2, 3, 9
 * and 16 sequences; one sequence's prompt fed inside the first batched step (the one-at-a-time
 * path in the same call); both index-K readings; an item refused inside a batch; the tiny
 * checkpoint (window 16), and small43 (the 43-entry production plan, window 128: prompts up
 * to 150 tokens) on batches of 1, 3, 16 (3 and 16 with verify blocks; 9 with the official
 * index-K reading on the fast kernels; exact 16-row decode inside the verify mix); an image
 * prompt's chunks (items with image rows) beside a decode row (tinyvl with a tower). Under the
 * sanitizers (DS41_ASAN) tiny only, batches of 1, 3, 16, the official reading at 9, and the
 * image case. */
#include "check.h"
#include "forward.h"
#include "restore.h"
#include "testutil.h"
#include "ds41.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* writes tests/configs/NAME as a random checkpoint (seed 7) under build/test-tmp once */
static ds41_engine *load(const char *dir, int exact) {
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.ctx_size = 0;   /* min(4096, the model's) */
    char err[512];
    ds41_engine *e = ds41_load(dir, &lp, err, sizeof err);
    if (!e) printf("  load %s: %s\n", dir, err);
    return e;
}

static ds41_session *open_s(ds41_engine *e, int index_k) {
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.draft = ds41_draft_block_size(e) > 0;
    sp.index_k = index_k;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    CHECK(s, "session: %s", err);
    return s;
}

#define MAXB 16
#define MAXP 200
#define MAXG 512

typedef struct pair {
    ds41_session *bat, *alone;
    int32_t prompt[MAXP];
    int len, fed;   /* fed: prompt tokens given so far (mode 2 feeds them in chunks) */
    int32_t G[MAXG];   /* greedy continuation: G[p] = the token at position p (p >= len) */
    int nG;
    /* this step */
    int32_t block[DS41_SPEC_MAX_DRAFTS + 1];
    int verify, k, m_alone, acc_alone;
    int32_t out_a[DS41_SPEC_MAX_DRAFTS + 2], out_b[DS41_SPEC_MAX_DRAFTS + 2];
    float *lg_a, *lg_b;
} pair;

/* mix: 0 decode only, 1 decode + verify. prefill_in_step: 1 = sequence 0's prompt is an item
 * of the first batched step; 2 = sequences 0 and 1 feed their prompts (96 tokens in chunks of
 * 45, and at least 12 in chunks of 5) over the first steps (0's chunk runs inside the batched
 * forward with `ahead` = the rest of its prompt, so its CED plan reaches from the prompt's end
 * and skips rows of the decoder layers, all of some; 1's in the same call one at a time), the
 * lone twins feed the same parts with ds41_feed_part. Every pair also computes the same number
 * of layer-rows. maxlen: other prompts' lengths 2 .. maxlen. */
static void run_case(ds41_engine *e, const char *name, int B, int steps, int mix, int index_k, int prefill_in_step,
                     int maxlen) {
    CASE_BEGIN();
    int V = ds41_vocab_size(e), blk = ds41_draft_block_size(e);
    pair *pr = calloc((size_t)B, sizeof *pr);
    ds41_batch_item items[MAXB];
    int n_verify = 0, n_accepted = 0, n_chunks = 0;
    CHECK(pr && B <= MAXB, "setup");
    if (!pr || B > MAXB) { case_end(name); free(pr); return; }
    for (int i = 0; i < B; i++) {
        pair *p = &pr[i];
        p->len = 2 + (int)((i * 37u + (unsigned)B * 11u) % (unsigned)(maxlen - 1));
        if (prefill_in_step == 2 && i == 0) p->len = 96;   /* chunks of 45, 45, 6 */
        if (prefill_in_step == 2 && i == 1 && p->len < 12) p->len = 12;   /* chunks of 5 */
        rand_ids(p->prompt, p->len, V, 1000u + (unsigned)i * 17u + (unsigned)B);
        p->bat = open_s(e, index_k);
        p->alone = open_s(e, index_k);
        p->lg_a = calloc((size_t)(blk + 2) * V, sizeof(float));
        p->lg_b = calloc((size_t)(blk + 2) * V, sizeof(float));
        if (!p->bat || !p->alone || !p->lg_a || !p->lg_b) { CHECK(0, "open"); goto out; }
        p->fed = prefill_in_step == 2 && i < 2 ? 0 : p->len;
        if (p->fed)
            CHECK(ds41_feed(p->alone, p->prompt, (size_t)p->len) == 0, "prefill alone: %s", ds41_session_error(p->alone));
        if (!(prefill_in_step && i == 0) && p->fed)
            CHECK(ds41_feed(p->bat, p->prompt, (size_t)p->len) == 0, "prefill: %s", ds41_session_error(p->bat));
        if (mix) {
            /* the greedy continuation, from a third session */
            ds41_session *g = open_s(e, index_k);
            if (!g) goto out;
            CHECK(ds41_feed(g, p->prompt, (size_t)p->len) == 0, "prefill g");
            p->nG = p->len;
            int need = p->len + steps * (blk + 1) + 2;
            while (p->nG < need && p->nG < MAXG) {
                int32_t t = argmax(ds41_logits(g), V);
                p->G[p->nG++] = t;
                if (ds41_feed(g, &t, 1)) break;
            }
            ds41_session_close(g);
        }
    }

    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < B; i++) {
            pair *p = &pr[i];
            ds41_batch_item *it = &items[i];
            memset(it, 0, sizeof *it);
            it->s = p->bat;
            p->verify = 0;
            if (prefill_in_step == 1 && i == 0 && step == 0) {   /* the prompt: a prefill item */
                it->ids = p->prompt;
                it->n = (size_t)p->len;
                continue;
            }
            if (p->fed < p->len) {   /* the next chunk of the prompt, and the same for the twin */
                int c = p->len - p->fed < (i == 0 ? 45 : 5) ? p->len - p->fed : (i == 0 ? 45 : 5);
                /* sequence 0's parts say how much of the prompt follows (its CED plan reaches from
                 * the prompt's end: rows of the last layers skipped, no logits before the end) */
                size_t ahead = i == 0 ? (size_t)(p->len - p->fed - c) : 0;
                CHECK(ds41_feed_part(p->alone, p->prompt + p->fed, (size_t)c, ahead) == 0, "seq %d step %d: chunk alone: %s",
                      i, step, ds41_session_error(p->alone));
                it->ids = p->prompt + p->fed;
                it->n = (size_t)c;
                it->ahead = ahead;
                p->fed += c;
                n_chunks++;
                continue;
            }
            int32_t pend = ds41_spec_pending(p->alone);
            int32_t t = pend >= 0 ? pend : argmax(ds41_logits(p->alone), V);
            long long P = ds41_session_pos(p->alone);
            int maxd = mix ? ds41_spec_max_drafts(p->alone) : 0;
            p->block[0] = t;
            if (mix && maxd > 0 && (i + step) % 3 != 0) {
                p->verify = 1;
                p->k = 1 + (i + step) % maxd;
                int bad = (i + step) % 2 ? (i * 3 + step) % (p->k + 1) : p->k;   /* p->k: no corrupted draft */
                for (int j = 0; j < p->k; j++) {
                    long long q = P + 1 + j;
                    int32_t d = q < p->nG ? p->G[q] : (int32_t)((q * 31) % V);
                    if (j == bad) d = (d + 1 + i) % V;
                    p->block[1 + j] = d;
                }
                p->m_alone = ds41_spec_verify(p->alone, t, p->block + 1, p->k, p->out_a, p->lg_a, &p->acc_alone);
                CHECK(p->m_alone > 0, "seq %d step %d: verify alone: %s", i, step, ds41_session_error(p->alone));
                it->ids = p->block;
                it->n = (size_t)p->k + 1;
                it->verify = 1;
                it->out = p->out_b;
                it->out_logits = p->lg_b;
            } else {
                CHECK(ds41_feed(p->alone, &t, 1) == 0, "seq %d step %d: feed alone: %s", i, step,
                      ds41_session_error(p->alone));
                it->ids = p->block;
                it->n = 1;
            }
        }
        int failed = ds41_batch_step(items, B);
        CHECK(failed == 0, "step %d: %d items failed (%s)", step, failed, ds41_session_error(items[0].s));
        for (int i = 0; i < B; i++) {
            pair *p = &pr[i];
            ds41_batch_item *it = &items[i];
            CHECK(!it->failed, "seq %d step %d failed: %s", i, step, ds41_session_error(p->bat));
            if (p->verify) {
                n_verify++;
                n_accepted += it->n_accepted;
                CHECK(it->n_out == p->m_alone && it->n_accepted == p->acc_alone,
                      "seq %d step %d: verify emitted %d (accepted %d), alone %d (%d)", i, step, it->n_out,
                      it->n_accepted, p->m_alone, p->acc_alone);
                if (it->n_out == p->m_alone && p->m_alone > 0) {
                    CHECK(!memcmp(p->out_a, p->out_b, (size_t)p->m_alone * sizeof(int32_t)), "seq %d step %d: ids differ",
                          i, step);
                    CHECK(!memcmp(p->lg_a, p->lg_b, (size_t)p->m_alone * V * sizeof(float)),
                          "seq %d step %d: verify logits differ", i, step);
                }
            }
            CHECK(ds41_session_pos(p->bat) == ds41_session_pos(p->alone), "seq %d step %d: pos %lld vs %lld", i, step,
                  ds41_session_pos(p->bat), ds41_session_pos(p->alone));
            CHECK(ds41_spec_pending(p->bat) == ds41_spec_pending(p->alone), "seq %d step %d: pending differs", i, step);
            /* --spec auto's gate weighs these: a batched verify records its acceptance as one alone */
            for (int j = 0; j < DS41_SPEC_MAX_DRAFTS; j++)
                CHECK(ds41_spec_acceptance(p->bat, j) == ds41_spec_acceptance(p->alone, j),
                      "seq %d step %d: acceptance estimate %d: %.17g vs %.17g alone", i, step, j,
                      ds41_spec_acceptance(p->bat, j), ds41_spec_acceptance(p->alone, j));
            CHECK(!memcmp(ds41_logits(p->bat), ds41_logits(p->alone), (size_t)V * sizeof(float)),
                  "seq %d step %d (%s, pos %lld): logits differ", i, step, p->verify ? "verify" : "decode",
                  ds41_session_pos(p->alone));
            CHECK(ds41_session_digest(p->bat) == ds41_session_digest(p->alone), "seq %d step %d: state digest differs",
                  i, step);
            const ds41_seq *qb = ds41_session_seq(p->bat), *qa = ds41_session_seq(p->alone);
            CHECK(qb->rows_computed == qa->rows_computed, "seq %d step %d: %lld layer-rows computed, alone %lld", i,
                  step, qb->rows_computed, qa->rows_computed);
        }
    }
    if (prefill_in_step == 2) {
        CHECK(n_chunks >= 5, "%d prompt chunks fed in steps", n_chunks);
        const ds41_seq *q0 = ds41_session_seq(pr[0].bat);
        printf("  %s: sequence 0 computed %lld of %lld layer-rows\n", name, q0->rows_computed, q0->rows_full);
    }
    if (mix) {
        printf("  %s: %d verify blocks, %d drafts accepted\n", name, n_verify, n_accepted);
        CHECK(n_verify > 0 && n_accepted > 0, "no verify block accepted a draft");
    }
out:
    for (int i = 0; i < B; i++) {
        ds41_session_close(pr[i].bat);
        ds41_session_close(pr[i].alone);
        free(pr[i].lg_a);
        free(pr[i].lg_b);
    }
    free(pr);
    case_end(name);
}

/* Errors inside a batch stay with their item: an id outside the vocabulary and a verify on an
 * empty session fail alone; the others run and equal their twins. */
static void errors_case(ds41_engine *e) {
    CASE_BEGIN();
    int V = ds41_vocab_size(e);
    ds41_session *a = open_s(e, 0), *b = open_s(e, 0), *c = open_s(e, 0), *tw = open_s(e, 0);
    if (!a || !b || !c || !tw) { case_end("batch_errors_stay_with_their_item"); return; }
    int32_t pr[5] = { 1, 2, 3, 4, 5 }, bad = V + 3, t = 7, blk[2] = { 7, 8 };
    ds41_feed(a, pr, 5);
    ds41_feed(b, pr, 5);
    ds41_feed(tw, pr, 5);
    ds41_batch_item it[3];
    memset(it, 0, sizeof it);
    it[0].s = a; it[0].ids = &bad; it[0].n = 1;
    it[1].s = b; it[1].ids = &t; it[1].n = 1;
    int32_t out[4];
    it[2].s = c; it[2].ids = blk; it[2].n = 2; it[2].verify = 1; it[2].out = out;
    int failed = ds41_batch_step(it, 3);
    CHECK(failed == 2 && it[0].failed && !it[1].failed && it[2].failed, "failed %d: %d %d %d", failed, it[0].failed,
          it[1].failed, it[2].failed);
    CHECK(ds41_session_pos(a) == 5, "refused item changed the session");
    ds41_feed(tw, &t, 1);
    CHECK(ds41_session_digest(b) == ds41_session_digest(tw), "the good item differs from its twin");
    /* the session refused by the vocabulary check still works */
    CHECK(ds41_feed(a, &t, 1) == 0 && ds41_session_digest(a) == ds41_session_digest(tw), "a after the refusal");
    /* a session listed twice: its items run in list order (b is fed 7 then 9, as its twin) */
    int32_t t2 = 9;
    ds41_batch_item d2[3];
    memset(d2, 0, sizeof d2);
    d2[0].s = b; d2[0].ids = &t; d2[0].n = 1;
    d2[1].s = a; d2[1].ids = &t2; d2[1].n = 1;
    d2[2].s = b; d2[2].ids = &t2; d2[2].n = 1;
    CHECK(ds41_batch_step(d2, 3) == 0, "duplicate step failed");
    ds41_feed(tw, &t, 1);
    ds41_feed(tw, &t2, 1);
    CHECK(ds41_session_digest(b) == ds41_session_digest(tw), "a session listed twice: not fed in list order");
    ds41_session_close(a);
    ds41_session_close(b);
    ds41_session_close(c);
    ds41_session_close(tw);
    case_end("batch_errors_stay_with_their_item");
}

/* An image prompt prefilled in the steps (batch items with image rows, as ds41 serve runs it):
 * its first chunk inside the batched forward beside another sequence's decode row, the rest in
 * the next step, then decode rows. Its twin takes the same chunks in steps of its own (one item
 * each), the other sequence's twin decodes alone: exact kernels, the logits and the state
 * digests equal after every step. A third session fed the whole prompt with ds41_feed_embeds has
 * the same logits at the prompt's end and every step after (what ds41 run --image computes). On
 * tinyvl with a vision tower, random BF16 rows at positions 3..30 of 48. Then an item with image
 * flags and no rows fails alone, its session unchanged. */
static void image_rows_case(const char *dir) {
    CASE_BEGIN();
    ds41_engine *e = load(dir, 1);
    CHECK(e, "tinyvl with a tower did not load");
    if (!e) { case_end("batch_image_rows_exact"); return; }
    int V = ds41_vocab_size(e), dim = ds41_model_dim(e);
    enum { N = 48, C1 = 29 };
    int32_t ids[N], pb[6];
    uint8_t img[N] = { 0 };
    float *emb = calloc((size_t)N * dim, sizeof *emb);
    rand_ids(ids, N, V, 11);
    rand_ids(pb, 6, V, 12);
    for (int t = 3; t <= 30; t++) {
        img[t] = 1;
        ids[t] = ds41_image_token_id(e);
        for (int d = 0; d < dim; d++) emb[(size_t)t * dim + d] = (float)(((t * 131 + d * 7) % 61) - 30) / 32.0f;   /* BF16-exact */
    }
    ds41_session *a = open_s(e, 0), *aw = open_s(e, 0), *whole = open_s(e, 0), *b = open_s(e, 0), *bw = open_s(e, 0);
    if (emb && a && aw && whole && b && bw) {
        ds41_feed(b, pb, 6);
        ds41_feed(bw, pb, 6);
        CHECK(ds41_feed_embeds(whole, ids, N, emb, img) == 0, "feed_embeds: %s", ds41_session_error(whole));
        int32_t tb = argmax(ds41_logits(b), V), ta = 0;
        ds41_batch_item it[2], tw;
        for (int step = 0; step < 5; step++) {
            memset(it, 0, sizeof it);
            it[0].s = b; it[0].ids = &tb; it[0].n = 1;
            if (step == 0) {   /* the first chunk, batched with b's decode row */
                it[1].s = a; it[1].ids = ids; it[1].n = C1; it[1].ahead = N - C1; it[1].emb = emb; it[1].is_image = img;
            } else if (step == 1) {   /* the rest */
                it[1].s = a; it[1].ids = ids + C1; it[1].n = N - C1; it[1].emb = emb + (size_t)C1 * dim; it[1].is_image = img + C1;
            } else {
                it[1].s = a; it[1].ids = &ta; it[1].n = 1;
                CHECK(ds41_feed(whole, &ta, 1) == 0, "whole: decode");
            }
            tw = it[1];
            tw.s = aw;
            CHECK(ds41_batch_step(it, 2) == 0, "step %d: %s / %s", step, ds41_session_error(a), ds41_session_error(b));
            CHECK(ds41_batch_step(&tw, 1) == 0, "step %d, twin: %s", step, ds41_session_error(aw));
            CHECK(ds41_feed(bw, &tb, 1) == 0, "b's twin");
            CHECK(ds41_session_digest(a) == ds41_session_digest(aw), "step %d: the image prompt's state differs", step);
            CHECK(ds41_session_digest(b) == ds41_session_digest(bw), "step %d: the text sequence's state differs", step);
            if (step == 0) continue;
            CHECK(!memcmp(ds41_logits(a), ds41_logits(aw), (size_t)V * sizeof(float)), "step %d: logits differ from the twin's", step);
            CHECK(!memcmp(ds41_logits(a), ds41_logits(whole), (size_t)V * sizeof(float)),
                  "step %d: logits differ from the whole prompt's (ds41_feed_embeds)", step);
            ta = argmax(ds41_logits(a), V);
            tb = argmax(ds41_logits(b), V);
        }
    }
    ds41_session_close(a); ds41_session_close(aw); ds41_session_close(whole); ds41_session_close(b); ds41_session_close(bw);
    case_end("batch_image_rows_exact");
    CASE_BEGIN();
    ds41_session *c = open_s(e, 0), *d = open_s(e, 0);
    if (c && d) {
        int32_t t = 5;
        ds41_feed(d, pb, 4);
        ds41_batch_item it2[2];
        memset(it2, 0, sizeof it2);
        it2[0].s = c; it2[0].ids = ids; it2[0].n = 8; it2[0].is_image = img;   /* image positions, no rows */
        it2[1].s = d; it2[1].ids = &t; it2[1].n = 1;
        int f = ds41_batch_step(it2, 2);
        CHECK(f == 1 && it2[0].failed && !it2[1].failed, "failed %d: %d %d", f, it2[0].failed, it2[1].failed);
        CHECK(strstr(ds41_session_error(c), "image positions without embeddings"), "message '%s'", ds41_session_error(c));
        CHECK(ds41_session_pos(c) == 0 && ds41_session_pos(d) == 5, "positions %lld %lld", ds41_session_pos(c), ds41_session_pos(d));
    }
    ds41_session_close(c); ds41_session_close(d);
    case_end("batch_image_rows_refused_alone");
    free(emb);
    ds41_unload(e);
}

/* SET_FULL: every batch size with and without verify blocks, and the error case; the other two:
 * decode-only batches of 1, 3 and 16 and decode + verify batches of 3 and 16, SET_REDUCED with
 * the error case and the official reading at 9 in both modes, SET_SMALL43 without the error
 * case, the official reading on the fast kernels only, and the exact 16 decode rows inside
 * decode_verify_B16 (a third of its rows are plain decode rows). */
enum { SET_FULL, SET_REDUCED, SET_SMALL43 };
static void suite(const char *ck, const char *dir, int maxlen, int steps, int set) {
    static const int sizes[] = { 1, 2, 3, 9, 16 };
    for (int exact = 1; exact >= 0; exact--) {
        ds41_engine *e = load(dir, exact);
        CHECK(e, "load");
        if (!e) { case_end(ck); continue; }
        char name[128];
        const char *mode = exact ? "exact" : "fast";
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            int B = sizes[si];
            if (set != SET_FULL && B != 1 && B != 3 && B != 16) continue;
            if (!(set == SET_SMALL43 && exact && B == 16)) {
                snprintf(name, sizeof name, "batch_%s_%s_decode_B%d", ck, mode, B);
                run_case(e, name, B, steps, 0, 0, B == 3, maxlen);
            }
            if (ds41_draft_block_size(e) > 0 && (set == SET_FULL || B == 3 || B == 16)) {
                snprintf(name, sizeof name, "batch_%s_%s_decode_verify_B%d", ck, mode, B);
                run_case(e, name, B, steps, 1, 0, B == 9, maxlen);
            }
        }
        if (ds41_draft_block_size(e) > 0 && !(set == SET_SMALL43 && exact)) {
            snprintf(name, sizeof name, "batch_%s_%s_decode_verify_official_B9", ck, mode);
            run_case(e, name, 9, steps, 1, 1, 0, maxlen);
        }
        /* prompts fed in chunks inside the steps, beside decode rows (and verify blocks) */
        snprintf(name, sizeof name, "batch_%s_%s_prefill_chunks_B4", ck, mode);
        run_case(e, name, 4, steps + 3, 0, 0, 2, maxlen);
        if (ds41_draft_block_size(e) > 0) {
            snprintf(name, sizeof name, "batch_%s_%s_prefill_chunks_verify_official_B5", ck, mode);
            run_case(e, name, 5, steps + 3, 1, 1, 2, maxlen);
        }
        if (exact && set != SET_SMALL43) errors_case(e);
        ds41_unload(e);
    }
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char tiny[4096], small[4096];
    CASE_BEGIN();
    int rc = make_ck("batch", "tiny", tiny, sizeof tiny);
    CHECK(rc == 0, "make_checkpoint.py tiny failed");
    case_end("batch_checkpoint_tiny");
    /* under the sanitizers (tests/run.sh's DS41_ASAN pass) the tiny checkpoint only, and its
     * reduced set (batches of 1, 3 and 16, the official reading at 9, the chunks; the error
     * case): the sizes 2 and 9 run the same code with other counts */
    int asan = under_sanitizers();
    if (rc == 0) suite("tiny", tiny, 40, 6, asan ? SET_REDUCED : SET_FULL);
    char vl[4096];
    CASE_BEGIN();
    int rv = write_test_ck_args("batch_tinyvl", "tinyvl", 7, 1, "--vision", vl, sizeof vl);
    CHECK(rv == 0, "make_checkpoint.py tinyvl --vision failed");
    case_end("batch_checkpoint_tinyvl");
    if (rv == 0) image_rows_case(vl);
    if (asan) return check_exit();
    CASE_BEGIN();
    rc = make_ck("batch", "small43", small, sizeof small);
    CHECK(rc == 0, "make_checkpoint.py small43 failed");
    case_end("batch_checkpoint_small43");
    if (rc == 0) suite("small43", small, 150, 3, SET_SMALL43);
    return check_exit();
}
