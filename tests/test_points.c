/* The deployment performance points as switches (issue 11 item 6) and the long-context
 * measurement support (item 7), src/engine/longctx.c, src/layers/attention.c:
 *  - every --ablate setting (P1 fused ratio-1 compressor, P2 packed FP4 main KV read by the
 *    attention kernel, P3 one fetch per block for all query heads; each off, all off) gives the
 *    same bits as all on: logits after a prefill and every decode step, and the whole-state
 *    digest, in exact mode and in fast mode (stated tolerance: 0, the arithmetic is the same);
 *    tiny and small43 checkpoints (ratio-1 and ratio-2 KV sources, candidate pool);
 *  - the packed-record decode table gives ds41_kv_rec_unpack's floats for every byte pattern;
 *  - the synthetic context: records valid (unpack then repack gives the same bytes, main KV,
 *    index K and ring records), entry counts n / ratio, position n, decode after it
 *    deterministic for a seed and the same under every ablate setting;
 *  - --load copy: bit-identical logits to mmap. */
#include "check.h"
#include "testutil.h"
#include "ds41.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "formats.h"
#include "forward.h"
#include "longctx.h"

static ds41_engine *load(const char *dir, int exact, int copy, int threads) {
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.n_threads = threads;
    lp.load = copy ? DS41_LOAD_COPY : DS41_LOAD_MMAP;
    lp.ctx_size = 0;
    char err[512];
    ds41_engine *e = ds41_load(dir, &lp, err, sizeof err);
    if (!e) printf("  load %s: %s\n", dir, err);
    return e;
}

#define PROMPT 150
#define STEPS 6

/* logits after the prompt and after each decode step [STEPS + 1][V], and the final digest;
 * synth > 0: a synthetic context of that many tokens instead of the prompt */
static int trajectory(ds41_engine *e, unsigned mask, long long synth, float *lg, uint64_t *dig) {
    ds41_engine_set_ablate(e, mask);
    int V = ds41_vocab_size(e);
    char err[512];
    ds41_session *s = ds41_session_open(e, NULL, err, sizeof err);
    if (!s) { printf("  session: %s\n", err); return -1; }
    int32_t ids[PROMPT + STEPS];
    rand_ids(ids, PROMPT + STEPS, V, 11);
    long long C = ds41_ctx_size(e);
    int np = C - STEPS - 1 < PROMPT ? (int)(C - STEPS - 1) : PROMPT;   /* tiny: a 128-token context */
    int rc = synth > 0 ? ds41_session_synthetic_context(s, synth, 5) : ds41_feed(s, ids, (size_t)np);
    if (!rc && synth > 0) rc = ds41_feed(s, ids, 1);   /* the first decode */
    if (!rc) memcpy(lg, ds41_logits(s), (size_t)V * sizeof(float));
    for (int i = 0; i < STEPS && !rc; i++) {
        rc = ds41_feed(s, &ids[np + i], 1);
        if (!rc) memcpy(lg + (size_t)(i + 1) * V, ds41_logits(s), (size_t)V * sizeof(float));
    }
    if (rc) printf("  feed: %s\n", ds41_session_error(s));
    *dig = ds41_session_digest(s);
    ds41_session_close(s);
    ds41_engine_set_ablate(e, 0);
    return rc;
}

static const unsigned MASKS[] = { DS41_ABLATE_P1, DS41_ABLATE_P2, DS41_ABLATE_P3, DS41_ABLATE_P6, 15u };

static void points_case(const char *ck, int exact, int threads, long long synth) {
    char dir[4096], name[160];
    snprintf(name, sizeof name, "ablate_%s_%s_t%d%s", ck, exact ? "exact" : "fast", threads, synth ? "_synthetic" : "");
    CASE_BEGIN();
    if (make_ck("points", ck, dir, sizeof dir)) { CHECK(0, "checkpoint %s", ck); case_end(name); return; }
    ds41_engine *e = load(dir, exact, 0, threads);
    CHECK(e, "load");
    if (e) {
        size_t V = (size_t)ds41_vocab_size(e), n = (STEPS + 1) * V;
        float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        uint64_t dref = 0, dgot = 0;
        CHECK(ref && got, "oom");
        if (ref && got && !trajectory(e, 0, synth, ref, &dref)) {
            int finite = 1;
            for (size_t i = 0; i < n; i++) finite &= isfinite(ref[i]) != 0;
            CHECK(finite, "non-finite logits");
            for (size_t m = 0; m < sizeof MASKS / sizeof MASKS[0]; m++) {
                CHECK(!trajectory(e, MASKS[m], synth, got, &dgot), "mask %u failed", MASKS[m]);
                CHECK(!memcmp(ref, got, n * sizeof(float)), "mask %u: logits differ from all on", MASKS[m]);
                CHECK(dref == dgot, "mask %u: state digest differs", MASKS[m]);
            }
        } else CHECK(0, "reference trajectory");
        free(ref);
        free(got);
        ds41_unload(e);
    }
    case_end(name);
}

/* every scale byte and code: the table decode is ds41_unpack_q4nv */
static void decode_table(void) {
    enum { D = 512 };
    uint8_t rec[D / 2 + D / 16];
    float a[D], b[D];
    int bad = 0;
    for (int sb = 0; sb < 256; sb += 32) {
        for (int i = 0; i < D / 2; i++) rec[i] = (uint8_t)(i * 37 + sb);
        for (int g = 0; g < D / 16; g++) rec[D / 2 + g] = (uint8_t)(sb + g);
        ds41_unpack_q4nv(rec, rec + D / 2, D, a);
        ds41_kv_rec_decode(rec, D, b);
        bad += memcmp(a, b, sizeof a) != 0;
    }
    CHECK(!bad, "%d scale ranges decode differently", bad);
}

/* v (the unpacked values of a Q4mx (q8 = 0) or Q8 record) finite and a fixed point of the
 * quantizer: packing them again and unpacking gives the same values. (The main-KV Q4nv records
 * are compared byte for byte; Q4mx / Q8 scales are powers of two rounded up from the group
 * maximum, so a repacked record may pick a smaller scale with the same values.) */
static int qdq_stable(const float *v, int d, int q8, uint8_t *rec, float *w) {
    for (int i = 0; i < d; i++) if (!isfinite(v[i])) return 0;
    if (q8) { ds41_pack_q8(v, d, rec, rec + d); ds41_unpack_q8(rec, rec + d, d, w); }
    else { ds41_pack_q4mx(v, d, rec, rec + d / 2); ds41_unpack_q4mx(rec, rec + d / 2, d, w); }
    return !memcmp(v, w, (size_t)d * sizeof(float));
}

/* records of a synthetic context round-trip through the unpackers and packers */
static void synthetic_records(void) {
    char dir[4096];
    if (make_ck("points", "small43", dir, sizeof dir)) { CHECK(0, "checkpoint"); return; }
    ds41_engine *e = load(dir, 1, 0, 1);
    CHECK(e, "load");
    if (!e) return;
    const ds41_config *cfg = e->cfg;
    ds41_seq s;
    ds41_err err;
    long long N = 1000;
    CHECK(!ds41_seq_init(&s, e, &err), "seq: %s", err.msg);
    CHECK(!ds41_seq_synthetic(&s, N, 3, &err), "synthetic: %s", err.msg);
    CHECK(ds41_seq_synthetic(&s, N, 3, &err) == -1, "a second fill of a non-empty sequence was accepted");
    CHECK(s.cache.pos == N, "position %lld", s.cache.pos);
    int D = cfg->head_dim, ID = cfg->index_head_dim;
    float *v = malloc((size_t)D * sizeof(float)), *w = malloc((size_t)D * sizeof(float));
    uint8_t *rec = malloc((size_t)ds41_swa_rec_bytes(cfg));
    int bad_kv = 0, bad_ik = 0, bad_ring = 0, empty = 0;
    for (int i = 0; i < s.cache.n_stores; i++) {
        ds41_kv_store *st = &s.cache.stores[i];
        CHECK(st->n_entries == N / st->ratio, "store %d: %lld entries", i, st->n_entries);
        for (long long j = 0; j < st->n_entries; j++) {
            const uint8_t *kr = ds41_store_kv_rec(st, j, 0, NULL), *ir = ds41_store_ik_rec(st, j, 0, NULL);
            ds41_kv_rec_unpack(cfg, kr, 1, v);
            ds41_pack_q4nv(v, D, rec, rec + D / 2);
            bad_kv += memcmp(kr, rec, (size_t)ds41_kv_rec_bytes(cfg)) != 0;
            int nz = 0;
            for (int d = 0; d < D; d++) nz += v[d] != 0.0f;
            empty += nz == 0;
            ds41_ik_rec_unpack(cfg, ir, 1, v);
            bad_ik += !qdq_stable(v, ID, 0, rec, w);
        }
    }
    for (int r = 0; r < s.cache.n_rings; r++) {
        ds41_ring *rg = &s.cache.rings[r];
        for (int k = 0; k < rg->slots; k++) {
            const uint8_t *q = rg->rec + (size_t)k * rg->rec_bytes;
            ds41_unpack_q8(q, q + D, D, v);
            bad_ring += !qdq_stable(v, D, 1, rec, w);
        }
    }
    CHECK(!bad_kv && !bad_ik && !bad_ring, "records not valid: %d main KV, %d index K, %d ring", bad_kv, bad_ik, bad_ring);
    CHECK(!empty, "%d all-zero main-KV records", empty);
    free(v);
    free(w);
    free(rec);
    ds41_seq_free(&s);
    ds41_unload(e);
}

/* the same seed gives the same state and decode; another seed another */
static void synthetic_deterministic(void) {
    char dir[4096];
    if (make_ck("points", "small43", dir, sizeof dir)) { CHECK(0, "checkpoint"); return; }
    ds41_engine *e = load(dir, 0, 0, 2);
    CHECK(e, "load");
    if (!e) return;
    char err[512];
    uint64_t d[3];
    float *lg[3];
    int V = ds41_vocab_size(e);
    for (int k = 0; k < 3; k++) {
        ds41_session *s = ds41_session_open(e, NULL, err, sizeof err);
        int32_t t = 5;
        lg[k] = malloc((size_t)V * sizeof(float));
        CHECK(s && lg[k], "session");
        if (!s || !lg[k]) { d[k] = (uint64_t)k; continue; }
        CHECK(!ds41_session_synthetic_context(s, 3000, k == 2 ? 9 : 4), "synthetic: %s", ds41_session_error(s));
        CHECK(!ds41_feed(s, &t, 1), "decode: %s", ds41_session_error(s));
        memcpy(lg[k], ds41_logits(s), (size_t)V * sizeof(float));
        d[k] = ds41_session_digest(s);
        ds41_session_close(s);
    }
    CHECK(d[0] == d[1] && !memcmp(lg[0], lg[1], (size_t)V * sizeof(float)), "same seed, different state or logits");
    CHECK(d[0] != d[2], "another seed, same state");
    for (int k = 0; k < 3; k++) free(lg[k]);
    ds41_unload(e);
}

/* --load copy: the same logits as mmap (small43; tiny under the sanitizers) */
static void load_copy(void) {
    char dir[4096];
    const char *ck = under_sanitizers() ? "tiny" : "small43";
    if (make_ck("points", ck, dir, sizeof dir)) { CHECK(0, "checkpoint"); return; }
    for (int exact = 0; exact < 2; exact++) {
        ds41_engine *a = load(dir, exact, 0, 1), *b = load(dir, exact, 1, 1);
        CHECK(a && b, "load");
        if (a && b) {
            size_t V = (size_t)ds41_vocab_size(a), n = (STEPS + 1) * V;
            float *la = malloc(n * sizeof(float)), *lb = malloc(n * sizeof(float));
            uint64_t da = 0, db = 0;
            CHECK(la && lb && !trajectory(a, 0, 0, la, &da) && !trajectory(b, 0, 0, lb, &db), "runs");
            CHECK(la && lb && !memcmp(la, lb, n * sizeof(float)) && da == db, "exact=%d: copy differs from mmap", exact);
            free(la);
            free(lb);
        }
        ds41_unload(a);
        ds41_unload(b);
    }
}

int main(void) {
    RUN_CASE(decode_table);
    /* under the sanitizers (tests/run.sh's DS41_ASAN pass) the tiny cases only (the same code
     * paths: both compress ratios, the candidate pool, one and two threads); the plain build
     * runs them all (small43 fast alone took 32 s of the sanitizer lane, the 2,000-token
     * synthetic context 2 minutes on an AVX2 machine) */
    int asan = under_sanitizers();
    points_case("tiny", 1, 1, 0);
    points_case("tiny", 0, 2, 0);
    if (!asan) {
        points_case("small43", 0, 2, 0);
        points_case("small43", 1, 1, 0);
        points_case("small43", 0, 1, 2000);
        points_case("small43", 1, 1, 2000);
    }
    RUN_CASE(synthetic_records);
    RUN_CASE(synthetic_deterministic);
    RUN_CASE(load_copy);
    return check_exit();
}
