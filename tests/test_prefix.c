/* Prefix cache (include/ds41.h, src/store/prefix.c, src/engine/restore.c), exact mode:
 *   - a session restored from cached blocks (exact replay) and then fed the rest of the prompt
 *     is bit-identical to a fresh prefill of the whole prompt: logits, whole-state digest, a
 *     greedy continuation with its logits at every step, and the DSpark proposal after it; on
 *     the demo model (window 64, 8 layers: replay of 505 rows from position > 0), on a tiny
 *     random checkpoint with a 1024-token context (window 16), and on small43 (43-entry
 *     production plan, replay from position 0); both index-K readings;
 *   - a prompt that is exactly cached (restore covers every token) has the fresh logits;
 *   - pages are shared, never written through: the publishing session and the restored one go
 *     on decoding different tokens and each still equals its own fresh twin;
 *   - after a restart (a new engine and cache over the same directory) the blocks come from
 *     disk and the restore is still bit-identical; a cache of another model (fast kernels,
 *     another index-K reading, another checkpoint) gets no hit;
 *   - LRU: a cache of 3 blocks keeps the most recently used prompt;
 *   - approx replay: global KV equal to the fresh prefill's, the rows it recomputes = window.
 * Checkpoints: models/demo, and tiny / small43 written by tools/make_checkpoint.py. */
#include "check.h"
#include "testutil.h"
#include "ds41.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char tmpdir[1024], demo[1100], tiny[1100], small43[1100];

static int sh(const char *cmd) { return system(cmd); }

/* tiny with a 1024-token context (its config says 128) */
static int make_tiny(void) {
    const char *root = env_or("DS41_ROOT", "."), *py = env_or("PYTHON", "/usr/bin/python3");
    char cmd[8192];
    snprintf(tiny, sizeof tiny, "%.1000s/prefix_tiny", tmpdir);
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s.cfg' && mkdir -p '%s.cfg' && sed 's/\"max_position_embeddings\": 128/\"max_position_embeddings\": 1024/' "
             "'%s/tests/configs/tiny/config.json' > '%s.cfg/config.json' && PYTHON='%s' bash '%s/tests/ckcache.sh' '%s' '%s.cfg' "
             "--seed 11 --token-map stub -q",
             tiny, tiny, root, tiny, py, root, tiny, tiny);
    return sh(cmd);
}

static int make_small43(void) {
    const char *root = env_or("DS41_ROOT", "."), *py = env_or("PYTHON", "/usr/bin/python3");
    char cmd[8192];
    snprintf(small43, sizeof small43, "%.1000s/prefix_small43", tmpdir);
    snprintf(cmd, sizeof cmd, "PYTHON='%s' bash '%s/tests/ckcache.sh' '%s' '%s/tests/configs/small43' --seed 3 --token-map stub -q",
             py, root, small43, root);
    return sh(cmd);
}

static ds41_session *open_s(ds41_engine *e, int index_k, int draft) {
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.index_k = index_k;
    sp.draft = draft;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    CHECK(s, "session: %s", err);
    return s;
}

static ds41_prefix_cache *open_pc(ds41_engine *e, int index_k, const char *dir, long long mem, int replay) {
    ds41_prefix_params pp;
    memset(&pp, 0, sizeof pp);
    pp.index_k = index_k;
    pp.dir = dir;
    pp.mem_bytes = mem;
    pp.replay = replay;
    char err[512];
    ds41_prefix_cache *pc = ds41_prefix_open(e, &pp, err, sizeof err);
    CHECK(pc, "prefix cache: %s", err);
    return pc;
}

static void prompt(int32_t *ids, int n, int V, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[i] = 2 + (int32_t)((seed >> 8) % (unsigned)(V - 2));
    }
}

/* What a session shows after its prompt: logits, digest, a greedy continuation of `steps`
 * tokens with the logits of each step and the digest at the end, and one DSpark proposal. */
#define STEPS 8
typedef struct view {
    int V;
    float *logits;           /* [(STEPS + 1) * V] */
    uint64_t d0, d1;
    int32_t toks[STEPS];
    int32_t draft[64];
    float conf[64];
    int has_draft;
} view;

static void observe(ds41_engine *e, ds41_session *s, view *v, int steps) {
    int V = ds41_vocab_size(e);
    memset(v, 0, sizeof *v);
    v->V = V;
    v->logits = calloc((size_t)(STEPS + 1) * V, sizeof(float));
    memcpy(v->logits, ds41_logits(s), (size_t)V * sizeof(float));
    v->d0 = ds41_session_digest(s);
    for (int i = 0; i < steps; i++) {
        int32_t t = argmax(ds41_logits(s), V);
        v->toks[i] = t;
        CHECK(ds41_feed(s, &t, 1) == 0, "decode: %s", ds41_session_error(s));
        memcpy(v->logits + (size_t)(i + 1) * V, ds41_logits(s), (size_t)V * sizeof(float));
    }
    v->d1 = ds41_session_digest(s);
    v->has_draft = 0;
    if (ds41_draft_block_size(e) > 0 && ds41_session_pos(s) >= 2) {
        int32_t t = argmax(ds41_logits(s), V);
        v->has_draft = ds41_session_draft(s, t, v->draft, v->conf) == 0;
    }
}

static void same(const view *a, const view *b, int steps, const char *what) {
    CHECK(!memcmp(a->logits, b->logits, (size_t)(steps + 1) * a->V * sizeof(float)), "%s: logits differ", what);
    CHECK(a->d0 == b->d0, "%s: state digest after the prompt differs", what);
    CHECK(a->d1 == b->d1, "%s: state digest after the continuation differs", what);
    CHECK(!memcmp(a->toks, b->toks, sizeof a->toks), "%s: continuation differs", what);
    CHECK(a->has_draft == b->has_draft, "%s: draft availability differs", what);
    if (a->has_draft && b->has_draft) {
        CHECK(!memcmp(a->draft, b->draft, sizeof a->draft), "%s: DSpark proposal differs", what);
        CHECK(!memcmp(a->conf, b->conf, sizeof a->conf), "%s: DSpark confidences differ", what);
    }
}

static void view_free(view *v) { free(v->logits); }

/* fresh prefill of ids[0..n) vs restore + feed of the rest, with the cache filled by the
 * fresh session (publish) */
static void restore_vs_fresh(const char *dir, int n, int index_k, long long ctx, unsigned seed, int steps,
                             long long expect_hit) {
    ds41_engine *e = load_checked(dir, 1, ctx);
    if (!e) return;
    int V = ds41_vocab_size(e), draft = ds41_draft_block_size(e) > 0;
    int32_t *ids = malloc((size_t)n * sizeof(int32_t));
    prompt(ids, n, V, seed);
    ds41_prefix_cache *pc = open_pc(e, index_k, NULL, 0, DS41_REPLAY_EXACT);
    ds41_session *a = open_s(e, index_k, draft), *b = open_s(e, index_k, draft);
    if (!pc || !a || !b) goto out;
    CHECK(ds41_prefix_restore(pc, a, ids, (size_t)n) == 0, "empty cache hit");
    CHECK(ds41_feed(a, ids, (size_t)n) == 0, "fresh prefill: %s", ds41_session_error(a));
    CHECK(ds41_prefix_publish(pc, a, ids, (size_t)n) == n / 128, "publish count");
    CHECK(ds41_prefix_publish(pc, a, ids, (size_t)n) == 0, "publishing twice adds nothing");
    long long hit = ds41_prefix_restore(pc, b, ids, (size_t)n);
    CHECK(hit == expect_hit, "restored %lld tokens, expected %lld (%s)", hit, expect_hit, ds41_session_error(b));
    if (hit > 0 && hit < n) CHECK(ds41_feed(b, ids + hit, (size_t)(n - hit)) == 0, "rest: %s", ds41_session_error(b));
    CHECK(ds41_session_pos(b) == n, "restored session at %lld", ds41_session_pos(b));
    view va, vb;
    observe(e, b, &vb, steps);   /* b first: it shares a's pages and must not change them */
    observe(e, a, &va, steps);
    same(&va, &vb, steps, dir);
    ds41_prefix_stats st;
    ds41_prefix_get_stats(pc, &st);
    CHECK(st.hits == expect_hit + 0 && st.queries == 2LL * n, "stats: hits %lld queries %lld", st.hits, st.queries);
    view_free(&va);
    view_free(&vb);
out:
    ds41_session_close(a);
    ds41_session_close(b);
    ds41_prefix_close(pc);
    free(ids);
    ds41_unload(e);
}

static void test_demo_exact_own(void) { restore_vs_fresh(demo, 700, DS41_INDEX_K_OWN, 1024, 7, STEPS, 640); }
static void test_demo_exact_official(void) { restore_vs_fresh(demo, 700, DS41_INDEX_K_OFFICIAL, 1024, 8, STEPS, 640); }
static void test_demo_exact_whole_prompt(void) { restore_vs_fresh(demo, 768, DS41_INDEX_K_OWN, 1024, 9, STEPS, 768); }
static void test_tiny_exact_own(void) { restore_vs_fresh(tiny, 650, DS41_INDEX_K_OWN, 1024, 3, STEPS, 640); }
static void test_tiny_exact_official(void) { restore_vs_fresh(tiny, 600, DS41_INDEX_K_OFFICIAL, 1024, 4, STEPS, 512); }
static void test_small43_exact_both(void) {
    restore_vs_fresh(small43, 300, DS41_INDEX_K_OWN, 512, 5, 4, 256);
    restore_vs_fresh(small43, 300, DS41_INDEX_K_OFFICIAL, 512, 6, 4, 256);
}

/* The session that published keeps decoding (its pages are shared with the cache and with the
 * restored session), then is reset and fed another prompt over the same pages; a third session
 * restored afterwards still equals a fresh prefill. */
static void test_shared_pages_not_written(void) {
    ds41_engine *e = load_checked(demo, 1, 1024);
    if (!e) return;
    int V = ds41_vocab_size(e), n = 600;
    int32_t ids[600], other[600];
    prompt(ids, n, V, 21);
    prompt(other, n, V, 22);
    ds41_prefix_cache *pc = open_pc(e, 0, NULL, 0, DS41_REPLAY_EXACT);
    ds41_session *a = open_s(e, 0, 1), *b = open_s(e, 0, 1), *c = open_s(e, 0, 1);
    CHECK(ds41_feed(a, ids, (size_t)n) == 0, "prefill");
    ds41_prefix_publish(pc, a, ids, (size_t)n);
    CHECK(ds41_prefix_restore(pc, b, ids, (size_t)n) == 512, "restore b");
    CHECK(ds41_feed(b, ids + 512, (size_t)(n - 512)) == 0, "rest b");
    /* a: reset, another prompt (writes into its private pages, never into the shared ones) */
    ds41_session_reset(a);
    CHECK(ds41_feed(a, other, (size_t)n) == 0, "prefill other");
    view vb, vc;
    observe(e, b, &vb, STEPS);
    CHECK(ds41_prefix_restore(pc, c, ids, (size_t)n) == 512, "restore c");
    CHECK(ds41_feed(c, ids + 512, (size_t)(n - 512)) == 0, "rest c");
    observe(e, c, &vc, STEPS);
    same(&vb, &vc, STEPS, "after the publisher reused its memory");
    /* and the fresh twin */
    ds41_session_reset(a);
    CHECK(ds41_feed(a, ids, (size_t)n) == 0, "prefill again");
    view va;
    observe(e, a, &va, STEPS);
    same(&va, &vc, STEPS, "fresh twin");
    view_free(&va); view_free(&vb); view_free(&vc);
    ds41_session_close(a); ds41_session_close(b); ds41_session_close(c);
    ds41_prefix_close(pc);
    ds41_unload(e);
}

/* restart: blocks written by one engine, read by another; other identities get nothing */
static void test_disk_restart(void) {
    char dir[1200], cmd[1400];
    snprintf(dir, sizeof dir, "%.1000s/prefix_store", tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    sh(cmd);
    int n = 700;
    int32_t ids[700];
    view fresh, rest;
    {
        ds41_engine *e = load_checked(demo, 1, 1024);
        if (!e) return;
        prompt(ids, n, ds41_vocab_size(e), 31);
        ds41_prefix_cache *pc = open_pc(e, 0, dir, 0, DS41_REPLAY_EXACT);
        ds41_session *a = open_s(e, 0, 1);
        CHECK(ds41_feed(a, ids, (size_t)n) == 0, "prefill");
        CHECK(ds41_prefix_publish(pc, a, ids, (size_t)n) == 5, "publish");
        ds41_prefix_flush(pc);
        ds41_prefix_stats st;
        ds41_prefix_get_stats(pc, &st);
        CHECK(st.disk_writes == 5 && st.disk_errors == 0, "disk writes %lld errors %lld", st.disk_writes, st.disk_errors);
        observe(e, a, &fresh, STEPS);
        ds41_session_close(a);
        ds41_prefix_close(pc);
        ds41_unload(e);
    }
    {
        ds41_engine *e = load_checked(demo, 1, 1024);
        if (!e) return;
        ds41_prefix_cache *pc = open_pc(e, 0, dir, 0, DS41_REPLAY_EXACT);
        ds41_session *b = open_s(e, 0, 1);
        /* what an MPI job's stages count before they agree on a restore (src/store/prefix_job.c):
         * the store's 5 blocks, nothing read into memory, no query counted */
        CHECK(ds41_prefix_held(pc, ids, (size_t)n, NULL) == 5, "held %lld blocks", ds41_prefix_held(pc, ids, (size_t)n, NULL));
        CHECK(ds41_prefix_held(pc, ids, 300, NULL) == 2, "held of a 300-token prefix");
        ds41_prefix_stats s0;
        ds41_prefix_get_stats(pc, &s0);
        CHECK(s0.disk_hits == 0 && s0.blocks == 0 && s0.queries == 0, "held changed the cache: disk hits %lld blocks %lld "
              "queries %lld", s0.disk_hits, s0.blocks, s0.queries);
        /* a restore capped at 2 blocks reads those 2 only; held then counts 2 in memory + 3 on disk */
        ds41_session *c = open_s(e, 0, 1);
        CHECK(ds41_prefix_restore_cap(pc, c, ids, (size_t)n, NULL, 2) == 256, "capped restore");
        ds41_prefix_get_stats(pc, &s0);
        CHECK(s0.disk_hits == 2 && s0.blocks == 2, "capped restore read %lld blocks, holds %lld", s0.disk_hits, s0.blocks);
        CHECK(ds41_prefix_held(pc, ids, (size_t)n, NULL) == 5, "held after the capped restore");
        ds41_session_close(c);
        CHECK(ds41_prefix_restore(pc, b, ids, (size_t)n) == 640, "restore from disk");
        CHECK(ds41_feed(b, ids + 640, (size_t)(n - 640)) == 0, "rest");
        ds41_prefix_stats st;
        ds41_prefix_get_stats(pc, &st);
        CHECK(st.disk_hits == 5, "disk hits %lld", st.disk_hits);
        observe(e, b, &rest, STEPS);
        same(&fresh, &rest, STEPS, "after restart");
        ds41_session_close(b);
        ds41_prefix_close(pc);
        /* another index-K reading: another fingerprint */
        pc = open_pc(e, 1, dir, 0, DS41_REPLAY_EXACT);
        b = open_s(e, 1, 1);
        CHECK(ds41_prefix_restore(pc, b, ids, (size_t)n) == 0, "other index-K reading hit");
        ds41_session_close(b);
        ds41_prefix_close(pc);
        ds41_unload(e);
    }
    {
        ds41_engine *e = load_checked(demo, 0, 1024);   /* fast kernels: other records */
        if (!e) return;
        ds41_prefix_cache *pc = open_pc(e, 0, dir, 0, DS41_REPLAY_EXACT);
        ds41_session *b = open_s(e, 0, 1);
        CHECK(ds41_prefix_restore(pc, b, ids, (size_t)n) == 0, "fast engine hit exact blocks");
        ds41_session_close(b);
        ds41_prefix_close(pc);
        ds41_unload(e);
    }
    {
        ds41_engine *e = load_checked(tiny, 1, 1024);   /* another checkpoint */
        if (!e) return;
        int32_t t[700];
        for (int i = 0; i < n; i++) t[i] = ids[i] % ds41_vocab_size(e);
        ds41_prefix_cache *pc = open_pc(e, 0, dir, 0, DS41_REPLAY_EXACT);
        ds41_session *b = open_s(e, 0, 1);
        CHECK(ds41_prefix_restore(pc, b, t, (size_t)n) == 0, "another checkpoint hit");
        ds41_session_close(b);
        ds41_prefix_close(pc);
        ds41_unload(e);
    }
    view_free(&fresh);
    view_free(&rest);
}

static void test_lru(void) {
    ds41_engine *e = load_checked(demo, 0, 1024);
    if (!e) return;
    int V = ds41_vocab_size(e), n = 384;
    int32_t p1[384], p2[384];
    prompt(p1, n, V, 41);
    prompt(p2, n, V, 42);
    double bpt = ds41_prefix_bytes_per_token(e);
    CHECK(bpt > 0, "bytes per token");
    long long node = (long long)(bpt * 128 + 0.5);
    ds41_prefix_cache *pc = open_pc(e, 0, NULL, 4 * node - 1, DS41_REPLAY_EXACT);   /* room for 3 blocks */
    ds41_session *s = open_s(e, 0, 0);
    CHECK(ds41_feed(s, p1, (size_t)n) == 0, "p1");
    CHECK(ds41_prefix_publish(pc, s, p1, (size_t)n) == 3, "publish p1");
    ds41_session_reset(s);
    CHECK(ds41_feed(s, p2, (size_t)n) == 0, "p2");
    CHECK(ds41_prefix_publish(pc, s, p2, (size_t)n) == 3, "publish p2");
    ds41_prefix_stats st;
    ds41_prefix_get_stats(pc, &st);
    CHECK(st.blocks == 3 && st.bytes == 3 * node, "held %lld blocks %lld bytes", st.blocks, st.bytes);
    ds41_session_reset(s);
    CHECK(ds41_prefix_restore(pc, s, p1, (size_t)n) == 0, "evicted prompt still hit");
    ds41_session_reset(s);
    CHECK(ds41_prefix_restore(pc, s, p2, (size_t)n) == 384, "recent prompt missed");
    /* trim (the serving pool needs room): leaves first, so the prompt's head stays longest */
    CHECK(ds41_prefix_trim(pc, 2 * node) == 2 * node, "trim to 2 blocks");
    ds41_session_reset(s);
    CHECK(ds41_prefix_restore(pc, s, p2, (size_t)n) == 256, "after trimming to 2 blocks: the first 2 stay");
    CHECK(ds41_prefix_trim(pc, 0) == 0, "trim to nothing");
    ds41_session_reset(s);
    CHECK(ds41_prefix_restore(pc, s, p2, (size_t)n) == 0, "trimmed cache still hit");
    ds41_session_close(s);
    ds41_prefix_close(pc);
    ds41_unload(e);
}

/* approx: global KV exact, the replay recomputes one window */
static void test_approx(void) {
    ds41_engine *e = load_checked(demo, 1, 1024);
    if (!e) return;
    int V = ds41_vocab_size(e), n = 700;
    int32_t ids[700];
    prompt(ids, n, V, 51);
    ds41_prefix_cache *pc = open_pc(e, 0, NULL, 0, DS41_REPLAY_APPROX);
    ds41_session *a = open_s(e, 0, 1), *b = open_s(e, 0, 1);
    CHECK(ds41_feed(a, ids, 640) == 0, "prefill");
    ds41_prefix_publish(pc, a, ids, 640);
    CHECK(ds41_prefix_restore(pc, b, ids, (size_t)n) == 640, "restore");
    ds41_prefix_stats st;
    ds41_prefix_get_stats(pc, &st);
    CHECK(st.replay_rows == 64, "approx replayed %lld rows (window 64)", st.replay_rows);
    ds41_state_info ia, ib;
    ds41_session_state(a, &ia);
    ds41_session_state(b, &ib);
    CHECK(ia.global_kv_bytes == ib.global_kv_bytes && ia.tokens == ib.tokens, "state sizes");
    CHECK(ds41_feed(b, ids + 640, (size_t)(n - 640)) == 0, "rest");
    CHECK(ds41_feed(a, ids + 640, (size_t)(n - 640)) == 0, "rest a");
    const float *la = ds41_logits(a), *lb = ds41_logits(b);
    double md = 0;
    int finite = 1;
    for (int i = 0; i < V; i++) {
        if (!isfinite(lb[i])) finite = 0;
        double d = fabs((double)la[i] - lb[i]);
        if (d > md) md = d;
    }
    CHECK(finite, "approx logits not finite");
    printf("  approx replay on the demo model: max |logit difference| %.4f after 60 more tokens\n", md);
    ds41_session_close(a);
    ds41_session_close(b);
    ds41_prefix_close(pc);
    ds41_unload(e);
}

int main(void) {
    const char *root = env_or("DS41_ROOT", "."), *build = env_or("DS41_BUILD", "build");
    if (build[0] == '/') snprintf(tmpdir, sizeof tmpdir, "%s/test-tmp", build);
    else snprintf(tmpdir, sizeof tmpdir, "%s/%s/test-tmp", root, build);
    snprintf(demo, sizeof demo, "%.1000s/models/demo", root);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", tmpdir);
    sh(cmd);
    if (make_tiny() || (!under_sanitizers() && make_small43())) { printf("FAIL checkpoints: make_checkpoint.py failed\n"); return 1; }
    /* under the sanitizers (make check-asan) the demo-model cases only: the page sharing,
     * restore, store and eviction code is the same, the other checkpoints add arithmetic */
    int asan = under_sanitizers();
    RUN_CASE(test_demo_exact_own);
    if (!asan) {
        RUN_CASE(test_demo_exact_official);
        RUN_CASE(test_demo_exact_whole_prompt);
        RUN_CASE(test_tiny_exact_own);
        RUN_CASE(test_tiny_exact_official);
        RUN_CASE(test_small43_exact_both);
    }
    RUN_CASE(test_shared_pages_not_written);
    RUN_CASE(test_disk_restart);
    RUN_CASE(test_lru);
    RUN_CASE(test_approx);
    return check_exit();
}
