/* The resume state a prefill node ships (src/pd/pd_resume.c, ds41_session_install; docs/pd.md)
 * on the demo model, exact kernels, DSpark off and on, in both forms (--pd-decoder prefill: the
 * decoder's rings; decode, DSpark on: the forward stops at the first decoder layer's keys and
 * the stream there travels, the install runs the decoder on it): a prefill node's forward over
 * three whole
 * blocks (CED, no logits) packed into a RESUME payload and installed with its pages into a fresh
 * session gives the cache digest (every state byte) of one node's prefill of the same blocks,
 * and the same logits bits and whole-session digest after the prompt's tail. A payload that does not fit (another position,
 * a ring count off by one) or a history that is not the ids' is refused with a message naming
 * it. No tolerance: exact mode promises the same bits. */
#include "check.h"
#include "testutil.h"
#include "ds41.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "pd.h"
#include "restore.h"

#define M 384     /* three blocks */
#define TAIL 57   /* the prompt's tail, fed after the state */

/* the decoder split's stream: layer 4's input at the last 253 positions, as pd_prefill.c takes it */
#define SROWS 253   /* demo: W + (L - D - 1)(W - 1) = 64 + 3 x 63 */
typedef struct tap { float *x; int taken; } tap;
static void tap_hook(void *arg, ds41_seq *s, int layer) {
    tap *t = arg;
    if (layer != s->stop_layer || !s->stream || s->stream_n != M) return;
    size_t hc = 4, xw = hc * 192, t0 = M - SROWS;
    memcpy(t->x, s->stream->X + t0 * xw, SROWS * xw * sizeof(float));
    memcpy(t->x + SROWS * xw, s->stream->pre + t0 * hc, SROWS * hc * sizeof(float));
    t->taken = 1;
}

static void one_case(ds41_engine *e, const int32_t *ids, int draft, int split) {
    /* the prefill node: one forward over the blocks, no logits, the CED row reach (split: up to
     * layer 4's keys) */
    ds41_session *p = test_session(e, 0), *one = test_session(e, draft), *b = test_session(e, draft);
    if (!p || !one || !b) return;
    ds41_seq *q = ds41_session_seq(p);
    ds41_err err;
    q->prefill = DS41_PREFILL_CED;
    tap t = { split ? malloc(SROWS * 4 * 193 * sizeof(float)) : NULL, 0 };
    if (split) {
        q->stop_layer = 4;
        q->layer_done = tap_hook;
        q->layer_done_arg = &t;
    }
    CHECK(ds41_forward(q, ids, M, 0, &err) == 0, "prefill node forward: %s", err.msg);
    CHECK(!split || t.taken, "the stream was not taken");
    CHECK(ds41_decoder_stream_rows(e->cfg, M) == SROWS && ds41_decoder_stream_rows(e->cfg, 128) == 128, "stream rows");
    size_t n = 0;
    uint8_t *pl = ds41_pd_resume_pack(q, draft, t.x, &n, &err);
    CHECK(pl, "pack: %s", err.msg);
    ds41_kvx_geom g;
    CHECK(ds41_pd_geom(q->e, &ds41_session_seq(b)->cache, &g, &err) == 0, "geom: %s", err.msg);
    /* demo: 8 rings x 64 slots x 66 B, one ratio-2 compressor of dim 64 (2 x 2 x 64 FP32), and
     * with DSpark the context rows: 64 x 3 targets x 192 BF16; split: the 4 encoder rings, no
     * context rows, 253 stream rows of 4 x 192 + 4 FP32 */
    size_t want = split ? 112 + 12 + 4 * 64 * 66 + 2 * 2 * 64 * 4 + SROWS * 4 * 193 * 4
                        : 112 + 12 + 8 * 64 * 66 + 2 * 2 * 64 * 4 + (draft ? 64 * 3 * 192 * 2 : 0);
    CHECK(n == want, "payload %zu bytes, expected %zu", n, want);
    /* the pages as the decode node receives them: [block][store] */
    int ns = q->cache.n_stores, nb = M / 128;
    uint8_t *pages[3 * 8];
    CHECK(ns <= 8, "%d stores", ns);
    if (ns > 8) return;
    for (int bl = 0; bl < nb; bl++)
        for (int i = 0; i < ns; i++) pages[bl * ns + i] = q->cache.stores[i].pages[bl];
    /* refusals first: nothing is installed from them */
    ds41_resume_state st;
    CHECK(ds41_pd_resume_view(&g, pl, n, M + 128, &st, &err) != 0 && strstr(err.msg, "position 384 (expected 512)"),
          "another position: %s", err.msg);
    pl[8] ^= 1;
    CHECK(ds41_pd_resume_view(&g, pl, n, M, &st, &err) != 0 &&
          strstr(err.msg, split ? "ring count 5 (expected 4)" : "ring count 9 (expected 8)"), "ring count: %s", err.msg);
    pl[8] ^= 1;
    /* a decode node whose checkpoint has no split (its geometry takes no stream) refuses one */
    ds41_kvx_geom nos = g;
    nos.stream_layer = nos.stream_width = nos.stream_max = 0;
    CHECK(!split || (ds41_pd_resume_view(&nos, pl, n, M, &st, &err) != 0 && strstr(err.msg, "253 decoder stream rows")),
          "a stream for a node without the split: %s", err.msg);
    CHECK(ds41_pd_resume_view(&g, pl, n, M, &st, &err) == 0, "view: %s", err.msg);
    ds41_resume_state bad = st;
    bad.hist[0] = st.hist[0] + 1;
    ds41_session *x = test_session(e, draft);
    CHECK(ds41_session_install(x, ids, M, pages, &bad) != 0 && strstr(ds41_session_error(x), "Engram history"),
          "a wrong history: %s", ds41_session_error(x));
    ds41_session_close(x);
    /* one node's prefill of the blocks against the installed state */
    CHECK(ds41_feed(one, ids, M) == 0, "feed: %s", ds41_session_error(one));
    CHECK(ds41_session_install(b, ids, M, pages, &st) == 0, "install: %s", ds41_session_error(b));
    /* the cache (pages, rings, compressors, history, owner, DSpark rings): what the state is;
     * the logits of the last block row are not shipped (the tail's forward gives the next) */
    CHECK(ds41_cache_digest(&ds41_session_seq(one)->cache) == ds41_cache_digest(&ds41_session_seq(b)->cache),
          "draft %d: cache digest after the blocks differs", draft);
    CHECK(ds41_feed(one, ids + M, TAIL) == 0 && ds41_feed(b, ids + M, TAIL) == 0, "tail feed");
    int V = ds41_vocab_size(e);
    CHECK(!memcmp(ds41_logits(one), ds41_logits(b), (size_t)V * sizeof(float)), "draft %d: logits after the tail differ",
          draft);
    CHECK(ds41_session_digest(one) == ds41_session_digest(b), "draft %d: state digest after the tail differs", draft);
    free(pl);
    free(t.x);
    ds41_session_close(p);
    ds41_session_close(one);
    ds41_session_close(b);
}

static void install_is_a_prefill(void) {
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/models/demo", env_or("DS41_ROOT", "."));
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = 1;
    ds41_engine *e = ds41_load(dir, &lp, err, sizeof err);
    CHECK(e, "load %s: %s", dir, err);
    if (!e) return;
    int32_t ids[M + TAIL];
    unsigned seed = 22;
    for (int i = 0; i < M + TAIL; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[i] = 3 + (int32_t)((seed >> 8) % 4000u);
    }
    one_case(e, ids, 0, 0);
    one_case(e, ids, 1, 0);
    /* the split with DSpark on only (its context rows come out of the install's forward; the
     * spec-off split runs end to end in tests/pd.test.sh): test time under ASan */
    one_case(e, ids, 1, 1);
    ds41_unload(e);
}

int main(void) {
    RUN_CASE(install_is_a_prefill);
    return check_exit();
}
