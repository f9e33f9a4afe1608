/* Library API sessions (include/ds41.h) on the tiny random checkpoint written by
 * tools/make_checkpoint.py (window 16, KV sources 1 (r=2) and 3 (r=1), one DSpark stage of
 * block 2, Engram): a reset session gives bit-identical logits, drafts and sampled tokens to a
 * fresh one; refused feeds change nothing; the context size is enforced exactly; the state
 * byte counts follow from the record sizes; two sessions of one 2-thread engine fed from two
 * threads at once give bit for bit what they give one after another; a second trace call
 * finishes the first. About 1 s. */
#include "check.h"
#include "testutil.h"
#include "ds41.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char ckpt[1024];

static int make_checkpoint(void) {
    const char *root = env_or("DS41_ROOT", "."), *build = env_or("DS41_BUILD", "build");
    const char *py = env_or("PYTHON", "/usr/bin/python3");
    if (build[0] == '/') snprintf(ckpt, sizeof ckpt, "%s/test-tmp/session_tiny", build);
    else snprintf(ckpt, sizeof ckpt, "%s/%s/test-tmp/session_tiny", root, build);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "PYTHON='%s' bash '%s/tests/ckcache.sh' '%s' '%s/tests/configs/tiny' --seed 5 --token-map stub -q",
             py, root, ckpt, root);
    return system(cmd);
}

static ds41_engine *load(int exact, int threads, long long ctx) {
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.n_threads = threads;
    lp.ctx_size = ctx;
    char err[512];
    ds41_engine *e = ds41_load(ckpt, &lp, err, sizeof err);
    CHECK(e, "load: %s", err);
    return e;
}

static ds41_session *open_session(ds41_engine *e, int draft, int chunk) {
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.draft = draft;
    sp.chunk = chunk;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    CHECK(s, "session: %s", err);
    return s;
}

/* What one run produces: the logits of every step, the sampled tokens, the drafts. */
#define MAX_STEPS 32
typedef struct record {
    int V, B, steps;
    float *logits;                       /* [steps][V] */
    int32_t tok[MAX_STEPS];
    int32_t dids[MAX_STEPS * 8];
    float dconf[MAX_STEPS * 8];
    ds41_state_info st;
} record;

static void record_init(record *r, const ds41_engine *e) {
    memset(r, 0, sizeof *r);
    r->V = ds41_vocab_size(e);
    r->B = ds41_draft_block_size(e);
    r->logits = calloc((size_t)MAX_STEPS * r->V, sizeof(float));
}
static void record_free(record *r) { free(r->logits); }

/* Feeds a prompt of n ids (a function of seed), then `steps - 1` decode steps of the sampled
 * token, drafting after each decode when the session drafts. -1 on a failed call. */
static int drive(ds41_session *s, int n, int seed, int steps, int draft, record *r) {
    int32_t prompt[128];
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)((i * 37 + seed * 11 + 3) % r->V);
    if (ds41_feed(s, prompt, (size_t)n)) { CHECK(0, "prompt: %s", ds41_session_error(s)); return -1; }
    r->steps = 0;
    for (int k = 0; k < steps; k++) {
        memcpy(r->logits + (size_t)k * r->V, ds41_logits(s), (size_t)r->V * sizeof(float));
        int32_t t = ds41_session_sample(s);
        r->tok[k] = t;
        r->steps = k + 1;
        if (draft && k > 0 &&
            ds41_session_draft(s, t, r->dids + (size_t)k * r->B, r->dconf + (size_t)k * r->B)) {
            CHECK(0, "draft at step %d: %s", k, ds41_session_error(s));
            return -1;
        }
        if (k + 1 < steps && ds41_feed(s, &t, 1)) { CHECK(0, "decode %d: %s", k, ds41_session_error(s)); return -1; }
    }
    ds41_session_state(s, &r->st);
    return 0;
}

static int same_record(const record *a, const record *b) {
    return a->steps == b->steps && !memcmp(a->logits, b->logits, (size_t)a->steps * a->V * sizeof(float)) &&
           !memcmp(a->tok, b->tok, sizeof a->tok) && !memcmp(a->dids, b->dids, sizeof a->dids) &&
           !memcmp(a->dconf, b->dconf, sizeof a->dconf);
}

/* A session used for one sequence (prompt longer than the window, decode, drafts, random
 * sampling), reset, then driven again gives exactly what a fresh session gives -- in exact
 * and fast mode, one-shot and chunked. */
static void reset_matches_fresh(void) {
    for (int mode = 0; mode < 2; mode++) {
        ds41_engine *e = load(mode, 1, 96);
        if (!e) return;
        for (int chunk = 0; chunk <= 7; chunk += 7) {
            record fresh, again, other;
            record_init(&fresh, e); record_init(&again, e); record_init(&other, e);
            ds41_session *a = open_session(e, 1, chunk), *b = open_session(e, 1, chunk);
            if (a && b) {
                ds41_session_set_sampling(a, 0.8f, 20, 0.95f, 0.0f, 1234);
                ds41_session_set_sampling(b, 0.8f, 20, 0.95f, 0.0f, 1234);
                /* a first holds another sequence (different prompt and length) */
                CHECK(drive(a, 29, 2, 9, 1, &other) == 0, "first sequence");
                ds41_session_reset(a);
                CHECK(ds41_session_pos(a) == 0, "pos after reset %lld", ds41_session_pos(a));
                const float *lg = ds41_logits(a);
                int nz = 0;
                for (int v = 0; v < fresh.V; v++) nz += lg[v] != 0.0f;
                CHECK(nz == 0, "%d non-zero logits after reset", nz);
                int32_t ids[8];
                float conf[8];
                CHECK(ds41_session_draft(a, 5, ids, conf) != 0, "draft with nothing fed after reset");
                ds41_state_info st;
                ds41_session_state(a, &st);
                CHECK(st.tokens == 0 && st.global_kv_bytes == 0, "state after reset: %lld tokens, %lld B", st.tokens,
                      st.global_kv_bytes);
                CHECK(drive(a, 21, 1, 8, 1, &again) == 0, "after reset");
                CHECK(drive(b, 21, 1, 8, 1, &fresh) == 0, "fresh");
                CHECK(same_record(&again, &fresh), "exact %d chunk %d: reset session differs from a fresh one", mode,
                      chunk);
                CHECK(again.st.global_kv_bytes == fresh.st.global_kv_bytes && again.st.tokens == fresh.st.tokens,
                      "state bytes differ");
                /* the pages of the longer first sequence stay allocated */
                CHECK(again.st.global_kv_page_bytes >= fresh.st.global_kv_page_bytes, "page bytes");
            }
            ds41_session_close(a);
            ds41_session_close(b);
            record_free(&fresh); record_free(&again); record_free(&other);
        }
        ds41_unload(e);
    }
}

/* Feeds refused up front (no tokens, an id outside the vocabulary, past the context) leave
 * the session exactly as it was. */
static void refused_feeds_change_nothing(void) {
    ds41_engine *e = load(0, 1, 64);
    if (!e) return;
    record ref, got;
    record_init(&ref, e); record_init(&got, e);
    ds41_session *a = open_session(e, 1, 0), *b = open_session(e, 1, 0);
    if (a && b) {
        int32_t p[3] = { 4, 5, 6 };
        CHECK(ds41_feed(a, p, 3) == 0, "feed: %s", ds41_session_error(a));
        int32_t bad[2] = { 7, 512 }, neg = -1;
        CHECK(ds41_feed(a, bad, 2) != 0 && strstr(ds41_session_error(a), "vocabulary"), "id 512 accepted");
        CHECK(ds41_feed(a, &neg, 1) != 0, "id -1 accepted");
        CHECK(ds41_feed(a, p, 0) != 0, "empty feed accepted");
        int32_t many[64] = { 0 };
        CHECK(ds41_feed(a, many, 62) != 0 && strstr(ds41_session_error(a), "context"), "62 tokens past 3 of 64 accepted");
        CHECK(ds41_session_pos(a) == 3, "pos %lld after refused feeds", ds41_session_pos(a));
        /* still usable, and on the same track as a session that never saw the errors */
        CHECK(ds41_feed(b, p, 3) == 0, "feed b");
        int32_t t = 9;
        CHECK(ds41_feed(a, &t, 1) == 0 && ds41_feed(b, &t, 1) == 0, "decode after refused feeds: %s",
              ds41_session_error(a));
        CHECK(!memcmp(ds41_logits(a), ds41_logits(b), (size_t)ref.V * sizeof(float)), "logits differ");
    }
    ds41_session_close(a);
    ds41_session_close(b);
    record_free(&ref); record_free(&got);
    ds41_unload(e);
}

/* A context of 24 holds exactly 24 tokens: prompt 20, four decodes, the fifth is refused;
 * drafting at the last position works (its block's positions are past the context, which
 * the RoPE tables cover). One-token feeds from position 0 as well. */
static void context_size_enforced(void) {
    ds41_engine *e = load(0, 1, 24);
    if (!e) return;
    CHECK(ds41_ctx_size(e) == 24, "ctx %lld", ds41_ctx_size(e));
    ds41_session *s = open_session(e, 1, 0);
    if (s) {
        int32_t p[25];
        for (int i = 0; i < 25; i++) p[i] = (int32_t)(i * 13 % 500);
        CHECK(ds41_feed(s, p, 25) != 0, "25 tokens into 24 accepted");
        CHECK(ds41_feed(s, p, 20) == 0, "prompt: %s", ds41_session_error(s));
        for (int k = 0; k < 4; k++) CHECK(ds41_feed(s, &p[k], 1) == 0, "decode %d: %s", k, ds41_session_error(s));
        CHECK(ds41_session_pos(s) == 24, "pos %lld", ds41_session_pos(s));
        int32_t ids[8];
        float conf[8];
        CHECK(ds41_session_draft(s, 3, ids, conf) == 0, "draft at the last position: %s", ds41_session_error(s));
        CHECK(ds41_feed(s, p, 1) != 0, "a 25th token accepted");
        CHECK(ds41_session_pos(s) == 24, "pos moved");
        ds41_session_reset(s);
        for (int k = 0; k < 24; k++) CHECK(ds41_feed(s, &p[k], 1) == 0, "token %d: %s", k, ds41_session_error(s));
        CHECK(ds41_feed(s, p, 1) != 0, "a 25th single token accepted");
    }
    ds41_session_close(s);
    ds41_unload(e);
}

/* State bytes after 21 tokens, from the tiny config's record sizes: main KV record
 * 64/2 + 64/16 = 36 B, index K 64/2 + 64/32 = 34 B; layer 1 (r = 2) holds 10 entries in pages
 * of 64, layer 3 (r = 1) 21 in pages of 128; SWA records 64 + 2 = 66 B, 16 slots, 6 layers +
 * 1 DSpark stage; compressor 2 x 2 x 64 floats; Engram history 3 ids. */
static void state_bytes(void) {
    ds41_engine *e = load(0, 1, 64);
    if (!e) return;
    ds41_session *s = open_session(e, 0, 0);
    if (s) {
        int32_t p[21];
        for (int i = 0; i < 21; i++) p[i] = (int32_t)(i * 7 % 500);
        CHECK(ds41_feed(s, p, 21) == 0, "feed");
        ds41_state_info st;
        ds41_session_state(s, &st);
        CHECK(st.tokens == 21, "tokens %lld", st.tokens);
        CHECK(st.global_kv_main_bytes == 31 * 36, "main %lld", st.global_kv_main_bytes);
        CHECK(st.global_kv_index_bytes == 31 * 34, "index %lld", st.global_kv_index_bytes);
        CHECK(st.global_kv_bytes == 31 * 70, "kv %lld", st.global_kv_bytes);
        CHECK(st.global_kv_page_bytes == 64 * 70 + 128 * 70, "pages %lld", st.global_kv_page_bytes);
        CHECK(st.swa_bytes == 6 * 16 * 66, "swa %lld", st.swa_bytes);
        CHECK(st.dspark_ring_bytes == 16 * 66, "dspark %lld", st.dspark_ring_bytes);
        CHECK(st.compressor_bytes == 2 * 2 * 64 * 4, "compressor %lld", st.compressor_bytes);
        CHECK(st.engram_bytes == 12, "engram %lld", st.engram_bytes);
        CHECK(st.total_bytes == 64 * 70 + 128 * 70 + 7 * 16 * 66 + 1024 + 12, "total %lld", st.total_bytes);
        CHECK(st.global_kv_bytes_per_token == 31.0 * 70 / 21, "per token %g", st.global_kv_bytes_per_token);
    }
    ds41_session_close(s);
    ds41_unload(e);
}

static long file_size(const char *dir, const char *name) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

/* A second ds41_session_trace finishes the first (state files written, files closed). KV
 * layer 1 (r = 2) holds 10 entries of 36 B after 21 tokens, 11 after 22. */
static void trace_twice(void) {
    ds41_engine *e = load(0, 1, 64);
    if (!e) return;
    ds41_session *s = open_session(e, 0, 0);
    char da[1100], db[1100];
    snprintf(da, sizeof da, "%s/trace_a", ckpt);
    snprintf(db, sizeof db, "%s/trace_b", ckpt);
    if (s) {
        int32_t p[22];
        for (int i = 0; i < 22; i++) p[i] = (int32_t)(i * 5 % 500);
        CHECK(ds41_session_trace(s, da) == 0, "trace a: %s", ds41_session_error(s));
        CHECK(ds41_feed(s, p, 21) == 0, "feed");
        CHECK(ds41_session_trace(s, db) == 0, "trace b: %s", ds41_session_error(s));
        CHECK(file_size(da, "kv_L1.bin") == 360, "a/kv_L1.bin %ld B", file_size(da, "kv_L1.bin"));
        CHECK(ds41_feed(s, p + 21, 1) == 0, "feed");
    }
    ds41_session_close(s);
    CHECK(file_size(db, "kv_L1.bin") == 396, "b/kv_L1.bin %ld B", file_size(db, "kv_L1.bin"));
    /* experts_L0: T, n_active, then T x 2 ids per forward; b saw one forward of 1 row */
    CHECK(file_size(db, "experts_L0.i32") == 4 * (2 + 2), "b/experts_L0.i32 %ld B", file_size(db, "experts_L0.i32"));
    ds41_unload(e);
}

typedef struct job { ds41_session *s; int n, seed; record *r; int rc; } job;
static void *job_main(void *v) {
    job *j = v;
    j->rc = drive(j->s, j->n, j->seed, 12, 1, j->r);
    return NULL;
}

/* Two sessions of one engine with a 2-thread pool, fed from two threads at once, give the
 * bytes they give one after another (fast and exact kernels). */
static void two_threads_two_sessions(void) {
    for (int mode = 0; mode < 2; mode++) {
        ds41_engine *e = load(mode, 2, 96);
        if (!e) return;
        record ra, rb, ca, cb;
        record_init(&ra, e); record_init(&rb, e); record_init(&ca, e); record_init(&cb, e);
        ds41_session *a = open_session(e, 1, 0), *b = open_session(e, 1, 5);
        if (a && b) {
            CHECK(drive(a, 40, 3, 12, 1, &ra) == 0, "serial a");
            CHECK(drive(b, 23, 4, 12, 1, &rb) == 0, "serial b");
            ds41_session_reset(a);
            ds41_session_reset(b);
            job ja = { a, 40, 3, &ca, 0 }, jb = { b, 23, 4, &cb, 0 };
            pthread_t ta, tb;
            int ok = pthread_create(&ta, NULL, job_main, &ja) == 0;
            ok &= pthread_create(&tb, NULL, job_main, &jb) == 0;
            CHECK(ok, "pthread_create");
            if (ok) {
                pthread_join(ta, NULL);
                pthread_join(tb, NULL);
                CHECK(ja.rc == 0 && jb.rc == 0, "concurrent runs failed");
                CHECK(same_record(&ra, &ca), "exact %d: session a differs when run concurrently", mode);
                CHECK(same_record(&rb, &cb), "exact %d: session b differs when run concurrently", mode);
            }
        }
        ds41_session_close(a);
        ds41_session_close(b);
        record_free(&ra); record_free(&rb); record_free(&ca); record_free(&cb);
        ds41_unload(e);
    }
}

int main(void) {
    if (make_checkpoint() != 0) {
        printf("FAIL make_checkpoint: tools/make_checkpoint.py failed\n");
        return 1;
    }
    RUN_CASE(reset_matches_fresh);
    RUN_CASE(refused_feeds_change_nothing);
    RUN_CASE(context_size_enforced);
    RUN_CASE(state_bytes);
    RUN_CASE(trace_twice);
    RUN_CASE(two_threads_two_sessions);
    return check_exit();
}
