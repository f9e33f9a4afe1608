/* Chunked prefill against one forward over the prompt (ds41_feed, src/engine/session.c): each
 * chunk plans its CED rows against the prompt's end (ds41_seq.plan_ahead), so a decoder layer
 * runs only on the rows the prompt's last logits or decode state can still reach.
 *
 * Every case feeds the same prompt to a one-shot session (DS41_CHUNK_OFF) and to a chunked one
 * and then decodes greedily; the two must agree bit for bit: the logits after the prompt and
 * after every decode step, the greedy tokens, the whole-state digest (ds41_session_digest:
 * rings, compressor state, KV / index-K records, Engram history, DSpark context row) after the
 * prompt and at the end, and the DSpark drafts after the prompt. The layer-rows the chunks
 * compute (ds41_seq.rows_computed) must equal the one-shot prefill's: chunks do no decoder
 * work that one forward skips. Exact and fast kernels (the fast ones are row-independent, so
 * the equality holds for them too), both index-K readings, a prompt at position 0 and a long
 * extend after one, and the default (chunk 0: feeds over DS41_CHUNK_AUTO tokens in about equal
 * chunks) on a long prompt; a prompt in the caller's parts (ds41_feed_part, and ds41_batch_step
 * items with `ahead`, as ds41 serve feeds its prefill chunks).
 *   tiny (window 16): chunks 16, 25, 34 of 100 tokens (ctx 128); the default on 2,300 tokens
 *     (the tiny config with a 4,096-position context);
 *     and on 2,300 tokens after 7;
 *   small43 (the 43-entry production plan, window 128): chunks 128 and 150 of 420 tokens
 *     (the official index-K reading: chunk 128 and the extend only; the exact kernels: chunk
 *     128 with the own reading and the extend with the official one, the rest on the fast
 *     kernels, which compute each row on its own too: 17 s less of make test).
 * (The compress ratios of both checkpoints are 1 and 2.)
 * Under the sanitizers (DS41_ASAN) tiny only, and the long prompt at position 0 with fast kernels
 * and the own index-K reading only. */
#include "check.h"
#include "ds41.h"
#include "testutil.h"
#include "forward.h"
#include "restore.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* writes tests/configs/NAME as a random checkpoint (seed 3) under build/test-tmp once; ctx > 0
 * replaces the config's max_position_embeddings of 128 with ctx */
static int make_ck_ctx(const char *name, int ctx, char *dir, size_t cap) {
    const char *root = env_or("DS41_ROOT", "."), *build = env_or("DS41_BUILD", "build");
    const char *py = env_or("PYTHON", "/usr/bin/python3");
    char base[1024], cfg[1100];
    if (build[0] == '/') snprintf(base, sizeof base, "%s/test-tmp/chunked_%s%s", build, name, ctx > 0 ? "_long" : "");
    else snprintf(base, sizeof base, "%s/%s/test-tmp/chunked_%s%s", root, build, name, ctx > 0 ? "_long" : "");
    snprintf(dir, cap, "%s", base);
    snprintf(cfg, sizeof cfg, "%s.cfg", base);
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "[ -f '%s/.complete' ] || { rm -rf '%s' && mkdir -p '%s' && "
             "sed 's/\"max_position_embeddings\": 128,/\"max_position_embeddings\": %d,/' '%s/tests/configs/%s/config.json' "
             ">'%s/config.json' && PYTHON='%s' bash '%s/tests/ckcache.sh' '%s' '%s' --seed 3 --token-map stub -q; }",
             base, cfg, cfg, ctx > 0 ? ctx : 128, root, name, cfg, py, root, base, cfg);
    return system(cmd);
}

static ds41_engine *load(const char *dir, int exact, long long ctx) {
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.ctx_size = ctx;
    char err[512];
    ds41_engine *e = ds41_load(dir, &lp, err, sizeof err);
    if (!e) printf("  load %s: %s\n", dir, err);
    return e;
}

static ds41_session *open_s(ds41_engine *e, int chunk, int index_k) {
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.chunk = chunk;
    sp.index_k = index_k;
    sp.draft = ds41_draft_block_size(e) > 0;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    if (!s) printf("  session: %s\n", err);
    return s;
}

#define STEPS 6

/* What one session gives: logits after the prompt and each decode step, the greedy tokens,
 * digests after the prompt and at the end, the drafts after the prompt, the prompt's
 * layer-rows. */
typedef struct outcome {
    float *logits;   /* [STEPS + 1][V] */
    int32_t tok[STEPS];
    int32_t draft[16];
    float conf[16];
    uint64_t d_prompt, d_end;
    long long rows;
} outcome;

/* Parts of a prompt fed by the caller (a server's prefill chunks): sizes, 0-terminated, the
 * last taking the rest; by ds41_feed_part, or by ds41_batch_step items with `ahead`. */
typedef struct parts {
    int by_batch;
    int size[8];
} parts;

/* ids[n] in parts (pp) or in one ds41_feed */
static int feed_prompt(ds41_session *s, const int32_t *ids, int n, const parts *pp) {
    if (!pp) return ds41_feed(s, ids, (size_t)n);
    for (int i = 0, off = 0; off < n; i++) {
        int m = pp->size[i] > 0 && pp->size[i] < n - off ? pp->size[i] : n - off;
        size_t ahead = (size_t)(n - off - m);
        if (pp->by_batch) {
            ds41_batch_item it;
            memset(&it, 0, sizeof it);
            it.s = s; it.ids = ids + off; it.n = (size_t)m; it.ahead = ahead;
            if (ds41_batch_step(&it, 1)) return -1;
        } else if (ds41_feed_part(s, ids + off, (size_t)m, ahead)) {
            return -1;
        }
        off += m;
    }
    return 0;
}

/* pre (np ids, np may be 0) fed one-shot first, then ids[n] with the session's chunk setting
 * (or in the caller's parts pp) */
static int drive(ds41_engine *e, int chunk, int index_k, const int32_t *pre, int np, const int32_t *ids, int n,
                 const parts *pp, outcome *o) {
    int V = ds41_vocab_size(e), B = ds41_draft_block_size(e);
    memset(o, 0, sizeof *o);
    o->logits = calloc((size_t)(STEPS + 1) * V, sizeof(float));
    ds41_session *s = open_s(e, chunk, index_k);
    int rc = -1;
    if (!s || !o->logits) goto out;
    if (np > 0) {
        if (ds41_feed(s, pre, (size_t)np)) { printf("  prefix: %s\n", ds41_session_error(s)); goto out; }
    }
    long long r0 = ds41_session_seq(s)->rows_computed;
    if (feed_prompt(s, ids, n, pp)) { printf("  prompt: %s\n", ds41_session_error(s)); goto out; }
    o->rows = ds41_session_seq(s)->rows_computed - r0;
    o->d_prompt = ds41_session_digest(s);
    memcpy(o->logits, ds41_logits(s), (size_t)V * sizeof(float));
    for (int k = 0; k < STEPS; k++) {
        int32_t t = ds41_session_sample(s);
        o->tok[k] = t;
        if (k == 0 && B > 0 && B <= 16 && ds41_session_draft(s, t, o->draft, o->conf)) {
            printf("  draft: %s\n", ds41_session_error(s));
            goto out;
        }
        if (ds41_feed(s, &t, 1)) { printf("  decode %d: %s\n", k, ds41_session_error(s)); goto out; }
        memcpy(o->logits + (size_t)(k + 1) * V, ds41_logits(s), (size_t)V * sizeof(float));
    }
    o->d_end = ds41_session_digest(s);
    rc = 0;
out:
    ds41_session_close(s);
    return rc;
}

/* aligned: the chunk bounds fall on compressor group bounds (multiples of every ratio);
 * otherwise a chunk leaves the rows of its incomplete last group in a compressor's state, in
 * slots one forward does not write (rows no later forward reads, which the next decode steps
 * overwrite), so the state is compared after decoding only */
static void compare_parts(const char *name, ds41_engine *e, int chunk, int index_k, const int32_t *pre, int np,
                          const int32_t *ids, int n, int aligned, const parts *pp) {
    int V = ds41_vocab_size(e);
    outcome a, b;
    CASE_BEGIN();
    int ra = drive(e, DS41_CHUNK_OFF, index_k, pre, np, ids, n, NULL, &a);
    int rb = drive(e, chunk, index_k, pre, np, ids, n, pp, &b);
    CHECK(ra == 0 && rb == 0, "a session failed");
    if (ra == 0 && rb == 0) {
        CHECK(!memcmp(a.logits, b.logits, (size_t)V * sizeof(float)), "logits after the prompt differ");
        CHECK(!aligned || a.d_prompt == b.d_prompt, "state after the prompt differs (digest %016llx vs %016llx)",
              (unsigned long long)a.d_prompt, (unsigned long long)b.d_prompt);
        CHECK(!memcmp(a.draft, b.draft, sizeof a.draft) && !memcmp(a.conf, b.conf, sizeof a.conf),
              "drafts after the prompt differ");
        CHECK(!memcmp(a.tok, b.tok, sizeof a.tok), "greedy tokens differ");
        CHECK(!memcmp(a.logits, b.logits, (size_t)(STEPS + 1) * V * sizeof(float)), "decode logits differ");
        CHECK(a.d_end == b.d_end, "state after decoding differs");
        CHECK(a.rows == b.rows, "chunks computed %lld layer-rows, one forward %lld", b.rows, a.rows);
    }
    free(a.logits);
    free(b.logits);
    case_end(name);
}

static void compare(const char *name, ds41_engine *e, int chunk, int index_k, const int32_t *pre, int np,
                    const int32_t *ids, int n, int aligned) {
    compare_parts(name, e, chunk, index_k, pre, np, ids, n, aligned, NULL);
}

static void ids_of(int32_t *ids, int n, int V, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        ids[i] = (int32_t)((x >> 8) % (unsigned)V);
    }
}

/* lean: the official index-K reading with the first chunk size only (prompt and extend): the
 * other chunk sizes and the caller's parts run the same chunk loop, the reading only changes
 * which index keys the decode steps use */
static void suite(const char *ck, const char *dir, long long ctx, int n, const int *chunks, int n_chunks, int n_pre,
                  int n_ext, int lean) {
    for (int exact = 1; exact >= 0; exact--) {
        ds41_engine *e = load(dir, exact, ctx);
        CASE_BEGIN();
        CHECK(e != NULL, "load failed");
        char name[256];
        snprintf(name, sizeof name, "chunked_%s_%s_load", ck, exact ? "exact" : "fast");
        case_end(name);
        if (!e) continue;
        int V = ds41_vocab_size(e);
        int32_t *ids = malloc((size_t)(n > n_pre + n_ext ? n : n_pre + n_ext) * sizeof(int32_t));
        if (!ids) { ds41_unload(e); continue; }
        for (int ik = 0; ik < 2; ik++) {
            const char *ikn = ik ? "official" : "own";
            ids_of(ids, n, V, 11u + (unsigned)ik);
            /* lean (small43): the fast kernels run every case; the exact ones, which compute
             * each row on its own as the fast ones do, the first chunk size with the own reading
             * and the extend with the official one */
            int n_c = !lean ? n_chunks : exact ? (ik ? 0 : 1) : (ik ? 1 : n_chunks);
            for (int c = 0; c < n_c; c++) {
                snprintf(name, sizeof name, "chunked_%s_%s_ik_%s_prompt%d_chunk%d", ck, exact ? "exact" : "fast", ikn, n,
                         chunks[c]);
                compare(name, e, chunks[c], ik, NULL, 0, ids, n, chunks[c] % 2 == 0);
            }
            /* an extend: a one-shot prefix, then a long feed chunked at P > 0 */
            ids_of(ids, n_pre + n_ext, V, 29u + (unsigned)ik);
            if (!(lean && exact && !ik)) {
                snprintf(name, sizeof name, "chunked_%s_%s_ik_%s_extend%d_at%d_chunk%d", ck, exact ? "exact" : "fast",
                         ikn, n_ext, n_pre, chunks[0]);
                compare(name, e, chunks[0], ik, ids, n_pre, ids + n_pre, n_ext, n_pre % 2 == 0 && chunks[0] % 2 == 0);
            }
            /* the prompt in the caller's parts (ds41_feed_part, ds41_batch_step items), the
             * session's chunk off: W + 2, W + 6 (even; the first reaching past the window, as
             * the bit-identity needs), then the rest */
            ids_of(ids, n, V, 11u + (unsigned)ik);
            int W = e->cfg->window;
            for (int by_batch = 0; by_batch < (lean && (ik || exact) ? 0 : 2); by_batch++) {
                parts pp = { by_batch, { W + 2, W + 6, 0 } };
                snprintf(name, sizeof name, "chunked_%s_%s_ik_%s_prompt%d_parts_%s", ck, exact ? "exact" : "fast", ikn, n,
                         by_batch ? "batch_step" : "feed_part");
                compare_parts(name, e, DS41_CHUNK_OFF, ik, NULL, 0, ids, n, 1, &pp);
            }
        }
        free(ids);
        ds41_unload(e);
    }
}

/* The default (chunk 0) on a prompt longer than DS41_CHUNK_AUTO: about equal chunks. */
static void auto_suite(const char *dir) {
    int n = DS41_CHUNK_AUTO + 252;
    /* under the sanitizers (a 2,300-token prompt is slow there) fast kernels and the own
     * index-K reading only; the exact and official variants run in the plain build */
    int asan = under_sanitizers();
    for (int exact = 1; exact >= 0; exact--) {
        if (asan && exact) continue;
        ds41_engine *e = load(dir, exact, 4096);
        CASE_BEGIN();
        CHECK(e != NULL, "load failed");
        char name[256];
        snprintf(name, sizeof name, "chunked_tiny_long_%s_load", exact ? "exact" : "fast");
        case_end(name);
        if (!e) continue;
        int32_t *ids = malloc((size_t)(n + 7) * sizeof(int32_t));
        for (int ik = 0; ids && ik < (asan ? 1 : 2); ik++) {
            ids_of(ids, n + 7, ds41_vocab_size(e), 41u + (unsigned)ik);
            snprintf(name, sizeof name, "chunked_tiny_long_%s_ik_%s_prompt%d_default", exact ? "exact" : "fast",
                     ik ? "official" : "own", n);
            compare(name, e, 0, ik, NULL, 0, ids, n, 1);
            /* after an odd prefix: the chunk bounds still fall on group bounds (positions); not
             * under the sanitizers (the same chunk loop as the prompt above, 17 s there) */
            if (asan) continue;
            snprintf(name, sizeof name, "chunked_tiny_long_%s_ik_%s_extend%d_at7_default", exact ? "exact" : "fast",
                     ik ? "official" : "own", n);
            compare(name, e, 0, ik, ids, 7, ids + 7, n, 1);
        }
        free(ids);
        ds41_unload(e);
    }
}

/* A part whose prompt would run past the context is refused up front and changes nothing. */
static void part_past_context(const char *dir) {
    CASE_BEGIN();
    ds41_engine *e = load(dir, 0, 64);
    ds41_session *s = e ? open_s(e, 0, 0) : NULL;
    CHECK(s != NULL, "no session");
    if (s) {
        int32_t ids[40];
        ids_of(ids, 40, ds41_vocab_size(e), 5u);
        CHECK(ds41_feed_part(s, ids, 40, 25) != 0, "40 + 25 tokens in a 64-token context accepted");
        CHECK(strstr(ds41_session_error(s), "exceed the context") != NULL, "message: %s", ds41_session_error(s));
        CHECK(ds41_session_pos(s) == 0, "position %lld after a refused part", ds41_session_pos(s));
        CHECK(ds41_feed_part(s, ids, 40, 24) == 0, "40 + 24 tokens refused: %s", ds41_session_error(s));
        CHECK(ds41_session_pos(s) == 40, "position %lld", ds41_session_pos(s));
    }
    ds41_session_close(s);
    ds41_unload(e);
    case_end("chunked_part_past_context_refused");
}

int main(void) {
    char tiny[4096], tiny_long[4096], small[4096];
    CASE_BEGIN();
    int rc = make_ck_ctx("tiny", 0, tiny, sizeof tiny);
    CHECK(rc == 0, "make_checkpoint.py tiny failed");
    case_end("chunked_checkpoint_tiny");
    int tiny_chunks[] = { 16, 25, 34 };
    if (rc == 0) suite("tiny", tiny, 128, 100, tiny_chunks, 3, 20, 90, 0);
    if (rc == 0) part_past_context(tiny);
    CASE_BEGIN();
    rc = make_ck_ctx("tiny", 4096, tiny_long, sizeof tiny_long);
    CHECK(rc == 0, "make_checkpoint.py tiny (4096 positions) failed");
    case_end("chunked_checkpoint_tiny_long");
    if (rc == 0) auto_suite(tiny_long);
    if (under_sanitizers()) return check_exit();
    CASE_BEGIN();
    rc = make_ck_ctx("small43", 0, small, sizeof small);
    CHECK(rc == 0, "make_checkpoint.py small43 failed");
    case_end("chunked_checkpoint_small43");
    int small_chunks[] = { 128, 150 };
    if (rc == 0) suite("small43", small, 1024, 420, small_chunks, 2, 100, 300, 1);
    return check_exit();
}
