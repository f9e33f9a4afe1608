/* DSpark draft forward (spec 5.1-5.2) on the tiny oracle checkpoint written by
 * tools/make_checkpoint.py: proposals are reproducible, identical for 1 and 3 threads in
 * exact mode, leave the ring exactly as seeding does (the slot-P rewrite of 5.2 writes the
 * same record), stay in the vocabulary; fast mode agrees with exact within a stated bound;
 * bad arguments are errors; and the proposals and confidence logits are bit-identical to the
 * Python reference's dspark.i32 / dspark.f32 traces (tiny config and the 43-layer plan). */
#include "check.h"
#include "testutil.h"
#include "dspark.h"
#include "formats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char ckpt[1024];

/* Writes a checkpoint of tests/configs/<config> into the build tree (afresh); path to out. */
static int make_checkpoint_of(const char *config, int seed, char *out, size_t cap) {
    char leaf[256];
    snprintf(leaf, sizeof leaf, "dspark_%s_s%d", config, seed);
    return write_test_ck(leaf, config, seed, 0, out, cap);
}
static int make_checkpoint(void) { return make_checkpoint_of("tiny", 3, ckpt, sizeof ckpt); }

static int32_t *read_map(const char *dir, int *n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/engram_token_map.i32", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    int32_t *m = malloc(512 * sizeof(int32_t));
    *n = (int)fread(m, sizeof(int32_t), 512, f);
    fclose(f);
    return m;
}

typedef struct run { ds41_engine e; ds41_seq s; int ok; } run;

static int run_open_dir(run *r, const char *dir, int exact, int threads, long long max_pos) {
    memset(r, 0, sizeof *r);
    ds41_err err;
    ds41_model *m = calloc(1, sizeof *m);
    if (ds41_model_open(dir, m, &err)) { CHECK(0, "open: %s", err.msg); free(m); return -1; }
    int n = 0;
    int32_t *map = read_map(dir, &n);
    CHECK(map && n == 512, "token map");
    if (ds41_engine_init(&r->e, m, 1, exact, threads, max_pos, map, 256, &err)) { CHECK(0, "engine: %s", err.msg); return -1; }
    if (ds41_seq_init(&r->s, &r->e, &err)) { CHECK(0, "seq: %s", err.msg); return -1; }
    r->ok = 1;
    return 0;
}
static int run_open(run *r, int exact, int threads) { return run_open_dir(r, ckpt, exact, threads, 96); }
static void run_close(run *r) {
    if (!r->ok) return;
    ds41_seq_free(&r->s);
    ds41_engine_free(&r->e);
}

/* prefill 21 tokens (longer than the window of 16), seed, then 3 decode steps each followed
 * by a proposal; writes 3 * block_size ids and confidences */
static int drive(run *r, int32_t *ids, float *conf) {
    ds41_err err;
    CHECK(r->s.mh_rows == 0, "fresh sequence");
    int32_t prompt[21];
    for (int i = 0; i < 21; i++) prompt[i] = (int32_t)((i * 37 + 11) % 500);
    if (ds41_forward(&r->s, prompt, 21, 1, &err)) { CHECK(0, "prefill: %s", err.msg); return -1; }
    if (ds41_dspark_seed(&r->e, &r->s.cache, r->s.main_hidden, r->s.mh_rows, r->s.mh_pos0, &err)) {
        CHECK(0, "seed: %s", err.msg);
        return -1;
    }
    int B = r->e.cfg->dspark_block_size;
    int32_t tok = ds41_argmax(r->s.logits, r->e.cfg->vocab_size);
    for (int step = 0; step < 3; step++) {
        if (ds41_forward(&r->s, &tok, 1, 1, &err)) { CHECK(0, "decode: %s", err.msg); return -1; }
        long long P = r->s.cache.pos - 1;
        CHECK(r->s.mh_rows == 1 && r->s.mh_pos0 == P, "main_hidden row of P");
        int32_t next = ds41_argmax(r->s.logits, r->e.cfg->vocab_size);
        if (ds41_dspark_seed(&r->e, &r->s.cache, r->s.main_hidden, 1, P, &err)) { CHECK(0, "seed: %s", err.msg); return -1; }
        ds41_ring *ring = &r->s.cache.rings[r->e.cfg->n_layers];
        size_t rb = (size_t)ring->slots * ring->rec_bytes;
        uint8_t *before = malloc(rb);
        memcpy(before, ring->rec, rb);
        if (ds41_dspark_propose(&r->e, &r->s.cache, r->s.main_hidden, P, next, NULL, ids + step * B, conf + step * B, &err)) {
            CHECK(0, "propose: %s", err.msg);
            free(before);
            return -1;
        }
        CHECK(!memcmp(before, ring->rec, rb), "propose changed the seeded ring");
        /* a second proposal from the same state gives the same bits */
        int32_t ids2[DS41_DSPARK_MAX_BLOCK];
        float conf2[DS41_DSPARK_MAX_BLOCK];
        ds41_dspark_propose(&r->e, &r->s.cache, r->s.main_hidden, P, next, NULL, ids2, conf2, &err);
        CHECK(!memcmp(ids2, ids + step * B, B * sizeof(int32_t)) && !memcmp(conf2, conf + step * B, B * sizeof(float)),
              "second proposal differs");
        free(before);
        tok = next;
    }
    return 0;
}

static int have_ckpt;

static void test_dspark_exact(void) {
    CHECK(have_ckpt, "could not write the tiny checkpoint with tools/make_checkpoint.py");
    if (!have_ckpt) return;
    run a, b;
    int32_t ia[3 * DS41_DSPARK_MAX_BLOCK], ib[3 * DS41_DSPARK_MAX_BLOCK];
    float ca[3 * DS41_DSPARK_MAX_BLOCK], cb[3 * DS41_DSPARK_MAX_BLOCK];
    if (run_open(&a, 1, 1) == 0 && drive(&a, ia, ca) == 0 && run_open(&b, 1, 3) == 0 && drive(&b, ib, cb) == 0) {
        int B = a.e.cfg->dspark_block_size;
        CHECK(!memcmp(ia, ib, 3 * B * sizeof(int32_t)), "ids differ between 1 and 3 threads");
        CHECK(!memcmp(ca, cb, 3 * B * sizeof(float)), "confidences differ between 1 and 3 threads");
        /* a full prefill keeps every row of main_hidden; CED the last window: the rings and
         * so the proposals must be identical */
        run f;
        int32_t ifu[3 * DS41_DSPARK_MAX_BLOCK];
        float cfu[3 * DS41_DSPARK_MAX_BLOCK];
        if (run_open(&f, 1, 1) == 0) {
            f.s.prefill = DS41_PREFILL_FULL;
            if (drive(&f, ifu, cfu) == 0)
                CHECK(!memcmp(ia, ifu, 3 * B * sizeof(int32_t)) && !memcmp(ca, cfu, 3 * B * sizeof(float)),
                      "full prefill gives other proposals than CED");
        }
        run_close(&f);
        for (int i = 0; i < 3 * B; i++) {
            CHECK(ia[i] >= 0 && ia[i] < a.e.cfg->vocab_size, "id %d out of range", ia[i]);
            CHECK(isfinite(ca[i]), "confidence %d not finite", i);
        }
        printf("  exact proposals:");
        for (int i = 0; i < 3 * B; i++) printf(" %d (%.4f)", ia[i], (double)ca[i]);
        printf("\n");
        /* errors */
        ds41_err err;
        int32_t x[DS41_DSPARK_MAX_BLOCK];
        float c[DS41_DSPARK_MAX_BLOCK];
        CHECK(ds41_dspark_propose(&a.e, &a.s.cache, a.s.main_hidden, 0, 5, NULL, x, c, &err) == -1, "P = 0 accepted");
        CHECK(ds41_dspark_propose(&a.e, &a.s.cache, a.s.main_hidden, 5, 512, NULL, x, c, &err) == -1 &&
              strstr(err.msg, "vocabulary"), "token 512 accepted");
        CHECK(ds41_dspark_propose(&a.e, &a.s.cache, a.s.main_hidden, 96, 5, NULL, x, c, &err) == -1, "P past the context");
    }
    run_close(&a);
    run_close(&b);
}

static void test_dspark_fast(void) {
    if (!have_ckpt) { CHECK(0, "no checkpoint"); return; }
    run a, b;
    int32_t ia[3 * DS41_DSPARK_MAX_BLOCK], ib[3 * DS41_DSPARK_MAX_BLOCK];
    float ca[3 * DS41_DSPARK_MAX_BLOCK], cb[3 * DS41_DSPARK_MAX_BLOCK];
    if (run_open(&a, 1, 1) == 0 && drive(&a, ia, ca) == 0 && run_open(&b, 0, 2) == 0 && drive(&b, ib, cb) == 0) {
        int B = a.e.cfg->dspark_block_size;
        /* Fast mode reorders every sum of the 6-layer target and the drafter and runs FP4 on the
         * int16 road (activations rescaled per block, elements far below the block's largest
         * rounded); on a random tiny model that moves logits by tenths (exact-mode.md) and can
         * flip later greedy tokens, so only the first proposal (same context in both modes) is
         * compared: its drafts must agree and its confidences differ by 0.079 at most here
         * (printed). Asserted: equal drafts, confidences within 0.2. */
        double md = 0;
        for (int i = 0; i < B; i++) md = fmax(md, fabs((double)ca[i] - cb[i]));
        printf("  fast vs exact, first proposal: max confidence difference %.4g\n", md);
        CHECK(!memcmp(ia, ib, (size_t)B * sizeof(int32_t)), "fast and exact first drafts differ");
        CHECK(md < 0.2, "fast confidences differ by %g", md);
    }
    run_close(&a);
    run_close(&b);
}

/* Against the Python reference (tools/reference/ref.py, run as a black box): its trace holds
 * one proposal per decode step, made from main_hidden[P] and the token just sampled (greedy);
 * the prompt forward only seeds the rings. C side: CED prefill (the default), 2 threads. */
static void conformance(const char *config, int seed, int n_prompt, int n_gen, long long max_pos) {
    char dir[1024], tr[1200], cmd[8192], ids[4096];
    if (make_checkpoint_of(config, seed, dir, sizeof dir)) { CHECK(0, "make_checkpoint %s", config); return; }
    int len = 0;
    unsigned x = 12345u + (unsigned)seed;
    int32_t prompt[512];
    for (int i = 0; i < n_prompt; i++) {
        x = x * 1103515245u + 12345u;
        prompt[i] = (int32_t)((x >> 16) % 512);
        len += snprintf(ids + len, sizeof ids - len, "%s%d", i ? "," : "", prompt[i]);
    }
    snprintf(tr, sizeof tr, "%s/ref-trace", dir);
    snprintf(cmd, sizeof cmd, "%s '%s/tools/reference/ref.py' -m '%s' --prompt-ids %s -n %d --trace '%s' >/dev/null 2>&1",
             env_or("PYTHON", "/usr/bin/python3"), env_or("DS41_ROOT", "."), dir, ids, n_gen, tr);
    if (system(cmd)) { CHECK(0, "ref.py failed on %s", config); return; }
    char p1[1300], p2[1300];
    snprintf(p1, sizeof p1, "%s/dspark.i32", tr);
    snprintf(p2, sizeof p2, "%s/dspark.f32", tr);
    FILE *fi = fopen(p1, "rb"), *ff = fopen(p2, "rb");
    CHECK(fi && ff, "reference wrote no dspark trace");
    run r;
    if (fi && ff && run_open_dir(&r, dir, 1, 2, max_pos) == 0) {
        ds41_err err;
        int B = r.e.cfg->dspark_block_size, V = r.e.cfg->vocab_size, props = 0, bad = 0;
        int rc = ds41_forward(&r.s, prompt, n_prompt, 1, &err);
        rc = rc ? rc : ds41_dspark_seed(&r.e, &r.s.cache, r.s.main_hidden, r.s.mh_rows, r.s.mh_pos0, &err);
        int32_t tok = ds41_argmax(r.s.logits, V);
        for (int g = 1; g < n_gen && !rc; g++) {
            rc = ds41_forward(&r.s, &tok, 1, 1, &err);
            long long P = r.s.cache.pos - 1;
            int32_t next = ds41_argmax(r.s.logits, V), cid[DS41_DSPARK_MAX_BLOCK], rid[DS41_DSPARK_MAX_BLOCK];
            float cc[DS41_DSPARK_MAX_BLOCK], rcf[DS41_DSPARK_MAX_BLOCK];
            rc = rc ? rc : ds41_dspark_seed(&r.e, &r.s.cache, r.s.main_hidden, r.s.mh_rows, r.s.mh_pos0, &err);
            rc = rc ? rc : ds41_dspark_propose(&r.e, &r.s.cache, r.s.main_hidden, P, next, NULL, cid, cc, &err);
            if (rc) break;
            if (fread(rid, 4, (size_t)B, fi) != (size_t)B || fread(rcf, 4, (size_t)B, ff) != (size_t)B) { bad = -1; break; }
            bad += memcmp(cid, rid, (size_t)B * 4) != 0 || memcmp(cc, rcf, (size_t)B * 4) != 0;
            props++;
            tok = next;
        }
        CHECK(rc == 0, "%s: %s", config, err.msg);
        CHECK(bad == 0 && props == n_gen - 1, "%s: %d of %d proposals differ from the reference (-1: trace short)",
              config, bad, props);
        run_close(&r);
    }
    if (fi) fclose(fi);
    if (ff) fclose(ff);
}

/* ds41_dspark_propose_batch: 3 sequences of one engine (prompts of 9, 21 and 40 tokens: a ring
 * not yet full and two full ones, on tiny's window of 16; small43: 3 stages, block 5, MoE), each
 * after a decode step; the batch's drafts and confidences equal each sequence's own proposal
 * bit for bit, with P5 reuse and without, exact and fast, and its ring writes are the single
 * proposal's. A bad token fails the batch with the single proposal's message. */
static void batch_case(const char *config, int seed, int exact) {
    char dir[1024];
    if (make_checkpoint_of(config, seed, dir, sizeof dir)) { CHECK(0, "make_checkpoint %s", config); return; }
    run r;
    if (run_open_dir(&r, dir, exact, 2, 128)) return;
    ds41_err err;
    const int n = 3, lens[3] = { 9, 21, 40 };
    int B = r.e.cfg->dspark_block_size, V = r.e.cfg->vocab_size, bad = 0;
    ds41_seq q[3];
    ds41_cache *c[3];
    const float *row[3];
    long long P[3];
    int32_t tn[3], one[3][DS41_DSPARK_MAX_BLOCK], got[3][DS41_DSPARK_MAX_BLOCK], *gp[3];
    float onec[3][DS41_DSPARK_MAX_BLOCK], gotc[3][DS41_DSPARK_MAX_BLOCK], *gcp[3];
    int reuse[3] = { 1, 1, 1 }, ok = 1;
    for (int i = 0; i < n && ok; i++) {
        ok = ds41_seq_init(&q[i], &r.e, &err) == 0;
        int32_t prompt[40];
        for (int t = 0; t < lens[i]; t++) prompt[t] = (int32_t)((t * 37 + 11 + 101 * i) % 500);
        ok = ok && ds41_forward(&q[i], prompt, lens[i], 1, &err) == 0;
        ok = ok && ds41_dspark_seed(&r.e, &q[i].cache, q[i].main_hidden, q[i].mh_rows, q[i].mh_pos0, &err) == 0;
        int32_t tok = ds41_argmax(q[i].logits, V);
        ok = ok && ds41_forward(&q[i], &tok, 1, 1, &err) == 0;
        ok = ok && ds41_dspark_seed(&r.e, &q[i].cache, q[i].main_hidden, 1, q[i].cache.pos - 1, &err) == 0;
        c[i] = &q[i].cache;
        row[i] = q[i].main_hidden;
        P[i] = q[i].cache.pos - 1;
        tn[i] = ds41_argmax(q[i].logits, V);
        gp[i] = got[i];
        gcp[i] = gotc[i];
    }
    CHECK(ok, "%s: sequences: %s", config, err.msg);
    for (int pass = 0; pass < 2 && ok; pass++) {   /* pass 0: P5 reuse; 1: none (the ring slot rewritten) */
        size_t rb[3];
        uint8_t *ring1[3] = { 0 };
        for (int i = 0; i < n; i++) {
            if (ds41_dspark_propose_ex(&r.e, c[i], row[i], P[i], tn[i], NULL, pass == 0, one[i], onec[i], &err)) {
                CHECK(0, "%s: propose: %s", config, err.msg);
                ok = 0;
            }
            ds41_ring *rg = &c[i]->rings[r.e.cfg->n_layers];
            rb[i] = (size_t)rg->slots * rg->rec_bytes;
            ring1[i] = malloc(rb[i]);
            memcpy(ring1[i], rg->rec, rb[i]);
        }
        memset(got, 0xAB, sizeof got);
        bad = 0;
        memset(gotc, 0xAB, sizeof gotc);
        int brc = ds41_dspark_propose_batch(&r.e, n, c, row, P, tn, pass == 0 ? reuse : NULL, 0, gp, gcp, &err);
        CHECK(brc == 0, "%s: batch: %s", config, brc ? err.msg : "");
        for (int i = 0; i < n; i++) {
            bad += memcmp(got[i], one[i], (size_t)B * sizeof(int32_t)) != 0 || memcmp(gotc[i], onec[i], (size_t)B * sizeof(float)) != 0;
            bad += memcmp(ring1[i], c[i]->rings[r.e.cfg->n_layers].rec, rb[i]) != 0;
            free(ring1[i]);
        }
        CHECK(bad == 0, "%s %s pass %d: %d of %d batched proposals (or rings) differ from the single ones", config,
              exact ? "exact" : "fast", pass, bad, 2 * n);
    }
    /* the first nd = B - 1 drafts only: those equal the single proposals', the last is 0 / 0.0 */
    if (ok && B > 1) {
        int32_t one2[3][DS41_DSPARK_MAX_BLOCK];
        float onec2[3][DS41_DSPARK_MAX_BLOCK];
        bad = 0;
        for (int i = 0; i < n; i++)
            bad += ds41_dspark_propose_ex(&r.e, c[i], row[i], P[i], tn[i], NULL, 1, one2[i], onec2[i], &err) != 0;
        memset(got, 0xAB, sizeof got);
        memset(gotc, 0xAB, sizeof gotc);
        CHECK(ds41_dspark_propose_batch(&r.e, n, c, row, P, tn, reuse, B - 1, gp, gcp, &err) == 0, "%s: nd: %s", config, err.msg);
        for (int i = 0; i < n; i++)
            bad += memcmp(got[i], one2[i], (size_t)(B - 1) * sizeof(int32_t)) != 0 ||
                   memcmp(gotc[i], onec2[i], (size_t)(B - 1) * sizeof(float)) != 0 || got[i][B - 1] != 0 || gotc[i][B - 1] != 0.0f;
        CHECK(bad == 0, "%s %s: %d of %d batches of %d drafts differ from the single proposals' first drafts", config,
              exact ? "exact" : "fast", bad, n, B - 1);
    }
    int32_t t2[3] = { tn[0], V, tn[2] };
    CHECK(ds41_dspark_propose_batch(&r.e, n, c, row, P, t2, NULL, 0, gp, gcp, &err) == -1 && strstr(err.msg, "outside the vocabulary"),
          "%s: a token outside the vocabulary was accepted", config);
    for (int i = 0; i < n; i++) ds41_seq_free(&q[i]);
    run_close(&r);
}
static void test_dspark_batch(void) {
    for (int exact = 1; exact >= 0; exact--) {
        batch_case("tiny", 3, exact);
        batch_case("small43", 6, exact);
    }
}

/* tiny: 1 stage, block 2, window 16; 45 prompt tokens (several windows) + 24 steps */
static void test_dspark_vs_reference_tiny(void) { conformance("tiny", 5, 45, 24, 128); }
/* the 43-layer production plan at small width: 3 stages, block 5 */
static void test_dspark_vs_reference_small43(void) { conformance("small43", 6, 37, 6, 256); }

int main(void) {
    struct stat sb;
    have_ckpt = make_checkpoint() == 0;
    if (have_ckpt) {
        char p[1200];
        snprintf(p, sizeof p, "%s/model.safetensors", ckpt);
        have_ckpt = stat(p, &sb) == 0;
    }
    RUN_CASE(test_dspark_exact);
    RUN_CASE(test_dspark_fast);
    RUN_CASE(test_dspark_batch);
    RUN_CASE(test_dspark_vs_reference_tiny);
    RUN_CASE(test_dspark_vs_reference_small43);
    return check_exit();
}
