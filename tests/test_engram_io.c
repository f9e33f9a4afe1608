/* Engram off RAM (P4; src/layers/engram_io.c, src/engine/engram_place.c).
 *
 * identity_*: exact kernels, one prompt then greedy decoding; the logits of every step (memcmp)
 *   and the tokens under --engram-mode ram, prefetch (row cache on, off, and smaller than one
 *   step) equal mmap's, on the tiny and small43 checkpoints and models/demo; also a batch of
 *   three sessions (ds41_feed_batch: one forward, rows through the first sequence's step) and
 *   speculative steps (verify blocks) on small43.
 * identity_tiny_pread, read_retry_eio_pread: the same on the pread path (DS41_ENGRAM_PREAD=1);
 *   identity_tiny_scales_disk, read_retry_short_scales_disk: with the scales read per row
 *   (DS41_ENGRAM_SCALES=disk) instead of held in RAM; identity_tiny_buffered,
 *   read_retry_short_buffered: buffered reads (DS41_ENGRAM_DIRECT=0) instead of O_DIRECT.
 * read_retry_*: DS41_ENGRAM_FAULT makes one read fail with EIO / come back half done: the read is
 *   retried, the logits stay bit-identical, the retry is counted.
 * read_error_*: every read fails (EIO, end of file): the feed fails with an error naming the
 *   table and offset, and is never computed with a zero row.
 * step_poll*: ds41_engram_step_poll (io_uring, pread, every read failing): never blocks, and
 *   once it says the rows are in, the waits read nothing more and give the mapping's bytes.
 * cache_clock: the row cache's hit accounting on a crafted sequence of steps (distinct rows per
 *   step, duplicates, CLOCK eviction with a 2-row cache) and the bytes of the rows it hands out
 *   (equal to the mapping's). */
#include "check.h"
#include "engram_io.h"
#include "engram_place.h"
#include "testutil.h"
#include "ds41.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 24
#define NG 8

static ds41_engine *load_mode(const char *dir, int mode, long long cache) {
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = 1;
    lp.ctx_size = 0;   /* min(4096, the model's) */
    lp.engram_mode = mode;
    lp.engram_cache = cache;
    char err[512];
    ds41_engine *e = ds41_load(dir, &lp, err, sizeof err);
    CHECK(e, "load %s (engram mode %d): %s", dir, mode, err);
    return e;
}

/* prompt, then NG greedy steps: logits [NG + 1][V] and tokens [NG]; 0 ok */
static int generate(ds41_engine *e, const int32_t *prompt, int np, float *lg, int32_t *tok) {
    ds41_session *s = test_session(e, 0);
    if (!s) return -1;
    int V = ds41_vocab_size(e), rc = 0;
    if (ds41_feed(s, prompt, (size_t)np)) { printf("  feed: %s\n", ds41_session_error(s)); rc = -1; }
    for (int g = 0; g <= NG && !rc; g++) {
        memcpy(lg + (size_t)g * V, ds41_logits(s), (size_t)V * sizeof(float));
        if (g == NG) break;
        tok[g] = argmax(ds41_logits(s), V);
        if (ds41_feed(s, &tok[g], 1)) { printf("  decode: %s\n", ds41_session_error(s)); rc = -1; }
    }
    ds41_session_close(s);
    return rc;
}

/* every mode against mmap on dir */
static void identity_on(const char *dir) {
    ds41_engine *ref = load_mode(dir, DS41_ENGRAM_MMAP, 0);
    if (!ref) return;
    int V = ds41_vocab_size(ref);
    int32_t prompt[NP], t0[NG], t1[NG];
    rand_ids(prompt, NP, V < 512 ? V : 512, 11);
    float *l0 = malloc((size_t)(NG + 1) * V * sizeof(float)), *l1 = malloc((size_t)(NG + 1) * V * sizeof(float));
    CHECK(generate(ref, prompt, NP, l0, t0) == 0, "mmap run");
    ds41_engram_stats st;
    ds41_engram_get_stats(ref, &st);
    CHECK(st.mode == DS41_ENGRAM_MMAP && st.steps == 0, "mmap: mode %d, %lld prefetch steps", st.mode, st.steps);
    ds41_unload(ref);
    struct { int mode; long long cache; const char *name; } m[] = {
        { DS41_ENGRAM_RAM, 0, "ram" }, { DS41_ENGRAM_PREFETCH, 0, "prefetch" },
        { DS41_ENGRAM_PREFETCH, -1, "prefetch, no cache" }, { DS41_ENGRAM_PREFETCH, 2000, "prefetch, 2000-byte cache" },
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        ds41_engine *e = load_mode(dir, m[i].mode, m[i].cache);
        if (!e) continue;
        memset(l1, 0xff, (size_t)(NG + 1) * V * sizeof(float));
        CHECK(generate(e, prompt, NP, l1, t1) == 0, "%s run", m[i].name);
        CHECK(!memcmp(t0, t1, sizeof t0), "%s: tokens differ from mmap", m[i].name);
        CHECK(!memcmp(l0, l1, (size_t)(NG + 1) * V * sizeof(float)), "%s: logits differ from mmap", m[i].name);
        ds41_engram_get_stats(e, &st);
        CHECK(st.mode == m[i].mode, "%s: mode %d in effect", m[i].name, st.mode);
        if (m[i].mode == DS41_ENGRAM_PREFETCH) {
            /* one prompt forward and NG decode steps; every distinct row is a hit or read */
            CHECK(st.steps == NG + 1, "%s: %lld steps, expected %d", m[i].name, st.steps, NG + 1);
            CHECK(st.lookups == st.hits + st.rows_read && st.rows_read > 0, "%s: lookups %lld hits %lld read %lld",
                  m[i].name, st.lookups, st.hits, st.rows_read);
            CHECK(st.errors == 0 && st.retries == 0, "%s: %lld errors %lld retries", m[i].name, st.errors, st.retries);
            if (m[i].cache < 0) CHECK(st.hits == 0 && st.cache_rows == 0, "%s: %lld hits without a cache", m[i].name, st.hits);
        }
        ds41_unload(e);
    }
    free(l0);
    free(l1);
}

static char tiny[4096], small[4096];
static void read_retry_eio(void);
static void read_retry_short(void);

static void identity_tiny(void) { identity_on(tiny); }
static void identity_tiny_scales_disk(void) {
    setenv("DS41_ENGRAM_SCALES", "disk", 1);
    identity_on(tiny);
    unsetenv("DS41_ENGRAM_SCALES");
}
static void identity_tiny_buffered(void) {
    setenv("DS41_ENGRAM_DIRECT", "0", 1);
    identity_on(tiny);
    unsetenv("DS41_ENGRAM_DIRECT");
}
static void read_retry_short_buffered(void) {
    setenv("DS41_ENGRAM_DIRECT", "0", 1);
    read_retry_short();
    unsetenv("DS41_ENGRAM_DIRECT");
}
static void identity_tiny_pread(void) {
    setenv("DS41_ENGRAM_PREAD", "1", 1);
    identity_on(tiny);
    unsetenv("DS41_ENGRAM_PREAD");
}
static void read_retry_short_scales_disk(void) {
    setenv("DS41_ENGRAM_SCALES", "disk", 1);
    read_retry_short();
    unsetenv("DS41_ENGRAM_SCALES");
}
static void read_retry_eio_pread(void) {
    setenv("DS41_ENGRAM_PREAD", "1", 1);
    read_retry_eio();
    unsetenv("DS41_ENGRAM_PREAD");
}
static void identity_small43(void) { identity_on(small); }
static void identity_demo(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/demo", env_or("DS41_ROOT", "."));
    identity_on(dir);
}

/* three sessions stepped together (one forward per step) under prefetch vs alone under mmap */
static void identity_batch_small43(void) {
    ds41_engine *ref = load_mode(small, DS41_ENGRAM_MMAP, 0), *e = load_mode(small, DS41_ENGRAM_PREFETCH, 4096);
    if (!ref || !e) { ds41_unload(ref); ds41_unload(e); return; }
    int V = ds41_vocab_size(e);
    enum { B = 3 };
    ds41_session *a[B], *b[B];
    int32_t p[B][NP], last[B];
    for (int i = 0; i < B; i++) {
        a[i] = test_session(ref, 0);
        b[i] = test_session(e, 0);
        rand_ids(p[i], NP, 256, 20 + i);
        CHECK(a[i] && b[i] && !ds41_feed(a[i], p[i], NP) && !ds41_feed(b[i], p[i], NP), "prompt %d", i);
    }
    for (int g = 0; g < NG; g++) {
        const int32_t *ids[B];
        size_t n[B];
        for (int i = 0; i < B; i++) {
            last[i] = argmax(ds41_logits(a[i]), V);
            ids[i] = &last[i];
            n[i] = 1;
            CHECK(!ds41_feed(a[i], &last[i], 1), "mmap decode %d", i);
        }
        CHECK(ds41_feed_batch(b, ids, n, B) == 0, "batch step %d", g);
        for (int i = 0; i < B; i++)
            CHECK(!memcmp(ds41_logits(a[i]), ds41_logits(b[i]), (size_t)V * sizeof(float)), "step %d seq %d differs", g, i);
    }
    for (int i = 0; i < B; i++) { ds41_session_close(a[i]); ds41_session_close(b[i]); }
    ds41_unload(ref);
    ds41_unload(e);
}

/* speculative steps (drafts verified in one forward) under prefetch vs plain greedy under mmap */
static void identity_spec_small43(void) {
    ds41_engine *ref = load_mode(small, DS41_ENGRAM_MMAP, 0), *e = load_mode(small, DS41_ENGRAM_PREFETCH, 0);
    if (!ref || !e) { ds41_unload(ref); ds41_unload(e); return; }
    if (ds41_draft_block_size(e) == 0) { printf("  small43 has no DSpark stages\n"); ds41_unload(ref); ds41_unload(e); return; }
    int V = ds41_vocab_size(e);
    int32_t prompt[NP], plain[64];
    rand_ids(prompt, NP, 256, 31);
    ds41_session *a = test_session(ref, 0), *b = test_session(e, 1);
    CHECK(a && b && !ds41_feed(a, prompt, NP) && !ds41_feed(b, prompt, NP), "prompts");
    for (int g = 0; g < 24; g++) {
        plain[g] = argmax(ds41_logits(a), V);
        CHECK(!ds41_feed(a, &plain[g], 1), "plain decode");
    }
    ds41_spec_params sp = { DS41_SPEC_FIXED, 3, NULL };
    int32_t out[16];
    int got = 0;
    while (got < 20) {
        int n = ds41_spec_step(b, &sp, out, 16, NULL, NULL, NULL);
        CHECK(n >= 1, "spec step: %s", ds41_session_error(b));
        if (n < 1) break;
        for (int i = 0; i < n && got < 24; i++, got++) CHECK(out[i] == plain[got], "token %d: %d vs %d", got, out[i], plain[got]);
    }
    ds41_session_close(a);
    ds41_session_close(b);
    ds41_unload(ref);
    ds41_unload(e);
}

/* one failing or short read: retried, same logits */
static void retry_with(const char *fault, const char *name) {
    ds41_engine *ref = load_mode(tiny, DS41_ENGRAM_MMAP, 0);
    setenv("DS41_ENGRAM_FAULT", fault, 1);
    ds41_engine *e = load_mode(tiny, DS41_ENGRAM_PREFETCH, -1);
    unsetenv("DS41_ENGRAM_FAULT");
    if (!ref || !e) { ds41_unload(ref); ds41_unload(e); return; }
    int V = ds41_vocab_size(e);
    int32_t prompt[NP], t0[NG], t1[NG];
    rand_ids(prompt, NP, 256, 5);
    float *l0 = malloc((size_t)(NG + 1) * V * sizeof(float)), *l1 = malloc((size_t)(NG + 1) * V * sizeof(float));
    CHECK(generate(ref, prompt, NP, l0, t0) == 0 && generate(e, prompt, NP, l1, t1) == 0, "%s: runs", name);
    CHECK(!memcmp(l0, l1, (size_t)(NG + 1) * V * sizeof(float)) && !memcmp(t0, t1, sizeof t0), "%s: logits differ", name);
    ds41_engram_stats st;
    ds41_engram_get_stats(e, &st);
    CHECK(st.retries == 1 && st.errors == 0, "%s: %lld retries, %lld errors (expected 1, 0)", name, st.retries, st.errors);
    free(l0);
    free(l1);
    ds41_unload(ref);
    ds41_unload(e);
}
static void read_retry_eio(void) { retry_with("eio:3", "eio:3"); }
static void read_retry_short(void) { retry_with("short:2", "short:2"); }

/* every read fails: the forward reports it */
static void error_with(const char *fault) {
    setenv("DS41_ENGRAM_FAULT", fault, 1);
    ds41_engine *e = load_mode(tiny, DS41_ENGRAM_PREFETCH, 0);
    unsetenv("DS41_ENGRAM_FAULT");
    if (!e) return;
    ds41_session *s = test_session(e, 0);
    int32_t prompt[NP];
    rand_ids(prompt, NP, 256, 5);
    CHECK(s && ds41_feed(s, prompt, NP) != 0, "%s: the feed succeeded", fault);
    const char *msg = s ? ds41_session_error(s) : "";
    CHECK(strstr(msg, "failed after 4 tries") && strstr(msg, "model.safetensors") && strstr(msg, "byte offset"),
          "%s: message '%s'", fault, msg);
    ds41_engram_stats st;
    ds41_engram_get_stats(e, &st);
    CHECK(st.errors > 0 && st.retries >= 3, "%s: %lld errors %lld retries", fault, st.errors, st.retries);
    ds41_session_close(s);
    ds41_unload(e);
}
static void read_error_eio(void) { error_with("eio-all"); }
static void read_error_eof(void) { error_with("eof-all"); }

static void bad_fault_setting(void) {
    setenv("DS41_ENGRAM_FAULT", "eio:zero", 1);
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.engram_mode = DS41_ENGRAM_PREFETCH;
    char err[512] = "";
    ds41_engine *e = ds41_load(tiny, &lp, err, sizeof err);
    unsetenv("DS41_ENGRAM_FAULT");
    CHECK(!e && strstr(err, "DS41_ENGRAM_FAULT"), "load with a malformed fault setting: '%s'", err);
    ds41_unload(e);
}

/* the row cache on crafted steps, straight on the layer API */
static void cache_clock(void) {
    ds41_model m;
    ds41_err err;
    if (ds41_model_open(tiny, &m, &err)) { CHECK(0, "open: %s", err.msg); return; }
    const ds41_config *cfg = &m.cfg;
    int cols = (cfg->engram_max_ngram - 1) * cfg->engram_n_heads, rb = cfg->engram_head_dim + cfg->engram_head_dim / 32;
    ds41_engram_io *io;
    if (ds41_engram_io_open(&io, cfg, &m.w, m.st, 2LL * rb, 0, &err)) { CHECK(0, "io: %s", err.msg); ds41_model_close(&m); return; }
    ds41_engram_step *st = ds41_engram_step_new(io);
    /* one row per step in slot 0 (the rest of the ids out of range: skipped), N = 1 */
    int64_t *ids = malloc((size_t)cfg->n_engram_layers * cols * sizeof(int64_t));
    const int64_t seq[] = { 10, 20, 30, 20, 10, 30, 20 };
    const int want_hit[] = { 0, 0, 0, 1, 0, 1, 0 };
    ds41_engram_io_stats s0, s1;
    const ds41_layer_weights *lw0 = NULL;
    for (int l = 0; l < cfg->n_layers; l++) if (cfg->layers[l].engram_slot == 0) lw0 = &m.w.layers[l];
    for (size_t k = 0; k < sizeof seq / sizeof seq[0]; k++) {
        for (int i = 0; i < cfg->n_engram_layers * cols; i++) ids[i] = -1;
        ids[0] = seq[k];
        ids[1] = seq[k];   /* a duplicate: one distinct row */
        ds41_engram_io_get_stats(io, &s0);
        CHECK(ds41_engram_step_issue(st, ids, 1, cols, &err) == 0, "issue: %s", err.msg);
        CHECK(ds41_engram_step_wait(st, 0, &err) == 0, "wait: %s", err.msg);
        ds41_engram_io_get_stats(io, &s1);
        CHECK(s1.lookups - s0.lookups == 1 && s1.refs - s0.refs == (long long)cfg->n_engram_layers * cols,
              "step %zu: %lld lookups, %lld refs", k, s1.lookups - s0.lookups, s1.refs - s0.refs);
        CHECK(s1.hits - s0.hits == want_hit[k], "step %zu (row %lld): %lld hits, expected %d", k, (long long)seq[k],
              s1.hits - s0.hits, want_hit[k]);
        CHECK(s1.rows_read - s0.rows_read == 1 - want_hit[k], "step %zu: %lld rows read", k, s1.rows_read - s0.rows_read);
        const uint8_t *r = ds41_engram_step_row(st, 0, seq[k]);
        CHECK(r && lw0 && !memcmp(r, lw0->eg_embed + seq[k] * cfg->engram_head_dim, (size_t)cfg->engram_head_dim) &&
              !memcmp(r + cfg->engram_head_dim, lw0->eg_scale + seq[k] * (cfg->engram_head_dim / 32),
                      (size_t)(cfg->engram_head_dim / 32)),
              "step %zu: row %lld differs from the mapping", k, (long long)seq[k]);
        CHECK(!ds41_engram_step_row(st, 0, seq[k] + 1) && !ds41_engram_step_row(st, 1, seq[k]), "rows not issued");
    }
    CHECK(s1.cache_rows == 2 && s1.cache_used == 2, "cache %lld rows, %lld used", s1.cache_rows, s1.cache_used);
    CHECK(s1.bytes_read == 5LL * rb, "bytes read %lld, expected %d (5 misses)", s1.bytes_read, 5 * rb);
    /* a whole step of distinct rows larger than the cache: all read, all right */
    for (int i = 0; i < cfg->n_engram_layers * cols; i++) ids[i] = 100 + i;
    CHECK(ds41_engram_step_issue(st, ids, 1, cols, &err) == 0, "issue wide");
    for (int sl = 0; sl < cfg->n_engram_layers; sl++) CHECK(ds41_engram_step_wait(st, sl, &err) == 0, "wait wide %d", sl);
    for (int sl = 0; sl < cfg->n_engram_layers; sl++)
        for (int c = 0; c < cols; c++) CHECK(ds41_engram_step_row(st, sl, ids[sl * cols + c]) != NULL, "row %d/%d", sl, c);
    free(ids);
    ds41_engram_step_free(st);
    ds41_engram_io_close(io);
    ds41_model_close(&m);
}

/* ds41_engram_step_poll (the reads --dp-attention answers other ranks with, overlapped with the
 * rank's forward): it submits every slot's reads (issue submits the first slot's only) and
 * never blocks; once it says 1 every slot's wait returns at once with the mapping's rows. On
 * the pread path it reads at once; with every read failing it ends at 1 and the wait reports
 * the error. */
static void poll_case(const char *pread_env, const char *fault) {
    if (pread_env) setenv("DS41_ENGRAM_PREAD", pread_env, 1);
    if (fault) setenv("DS41_ENGRAM_FAULT", fault, 1);
    ds41_model m;
    ds41_err err;
    if (ds41_model_open(tiny, &m, &err)) { CHECK(0, "open: %s", err.msg); goto out; }
    const ds41_config *cfg = &m.cfg;
    int cols = (cfg->engram_max_ngram - 1) * cfg->engram_n_heads, L = cfg->n_engram_layers, hd = cfg->engram_head_dim;
    ds41_engram_io *io;
    if (ds41_engram_io_open(&io, cfg, &m.w, m.st, 0, 0, &err)) { CHECK(0, "io: %s", err.msg); ds41_model_close(&m); goto out; }
    ds41_engram_step *st = ds41_engram_step_new(io);
    int64_t *ids = malloc((size_t)L * cols * sizeof(int64_t));
    for (int i = 0; i < L * cols; i++) ids[i] = 7 + 3 * i;
    CHECK(ds41_engram_step_issue(st, ids, 1, cols, &err) == 0, "issue: %s", err.msg);
    int polls = 0, in = 0;
    for (; polls < 2000000 && !(in = ds41_engram_step_poll(st)); polls++) {}
    CHECK(in, "the reads never came in (%d polls)", polls);
    CHECK(!pread_env || polls == 0, "pread: %d polls before the rows were in", polls);
    ds41_engram_io_stats s0, s1;
    ds41_engram_io_get_stats(io, &s0);
    for (int sl = 0; sl < L; sl++) {
        int rc = ds41_engram_step_wait(st, sl, &err);
        if (fault) {
            CHECK(rc != 0 && strstr(err.msg, "failed after 4 tries"), "slot %d: wait %d '%s'", sl, rc, rc ? err.msg : "");
            continue;
        }
        CHECK(rc == 0, "wait %d: %s", sl, err.msg);
        const ds41_layer_weights *lw = NULL;
        for (int l = 0; l < cfg->n_layers; l++) if (cfg->layers[l].engram_slot == sl) lw = &m.w.layers[l];
        for (int c = 0; c < cols && lw; c++) {
            int64_t id = ids[sl * cols + c];
            const uint8_t *r = ds41_engram_step_row(st, sl, id);
            CHECK(r && !memcmp(r, lw->eg_embed + id * hd, (size_t)hd) && !memcmp(r + hd, lw->eg_scale + id * (hd / 32), (size_t)(hd / 32)),
                  "slot %d row %lld differs from the mapping", sl, (long long)id);
        }
    }
    ds41_engram_io_get_stats(io, &s1);
    CHECK(fault || s1.bytes_read == s0.bytes_read, "the waits read %lld more bytes after the poll said 1", s1.bytes_read - s0.bytes_read);
    free(ids);
    ds41_engram_step_free(st);
    ds41_engram_io_close(io);
    ds41_model_close(&m);
out:
    unsetenv("DS41_ENGRAM_PREAD");
    unsetenv("DS41_ENGRAM_FAULT");
}
static void step_poll(void) { poll_case(NULL, NULL); }
static void step_poll_pread(void) { poll_case("1", NULL); }
static void step_poll_error(void) { poll_case(NULL, "eio-all"); }

int main(void) {
    if (make_ck("egio", "tiny", tiny, sizeof tiny) || make_ck("egio", "small43", small, sizeof small)) {
        printf("FAIL engram_io_checkpoints: make_checkpoint.py failed\n");
        return 1;
    }
    RUN_CASE(identity_tiny);
    RUN_CASE(identity_tiny_pread);
    RUN_CASE(identity_tiny_scales_disk);
    RUN_CASE(identity_tiny_buffered);
    RUN_CASE(identity_demo);
    RUN_CASE(read_retry_eio);
    RUN_CASE(read_retry_short);
    RUN_CASE(read_retry_eio_pread);
    RUN_CASE(read_retry_short_scales_disk);
    RUN_CASE(read_retry_short_buffered);
    RUN_CASE(read_error_eio);
    RUN_CASE(read_error_eof);
    RUN_CASE(bad_fault_setting);
    RUN_CASE(cache_clock);
    RUN_CASE(step_poll);
    RUN_CASE(step_poll_pread);
    RUN_CASE(step_poll_error);
    if (!under_sanitizers()) {
        RUN_CASE(identity_small43);
        RUN_CASE(identity_batch_small43);
        RUN_CASE(identity_spec_small43);
    }
    return check_exit();
}
