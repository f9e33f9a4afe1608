/* vision_feed: drives the library's image path for tests/vision.test.sh, in exact mode.
 *   vision_feed DIR PIXELS H W PRE POST N OUT [CHUNK]
 * PIXELS: raw BF16 [3, H, W]. The prompt is PRE text ids (1 + 7 i mod 400), the image span
 * of ds41_image_span (every position the config's image_token_id), POST text ids (3 + 11 i mod
 * 400); then N - 1 greedy decode steps. OUT gets the N logits rows (F32 [N, vocab]: the prompt's
 * last, then one per decode step); CHUNK > 0: the prompt fed in chunks of CHUNK positions (the
 * session's chunk setting; image rows on both sides of a bound). Also checks that ds41_feed_embeds with no image rows gives
 * ds41_feed's logits bit for bit (prints PASS / FAIL lines). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds41.h"
#include "vision_px.h"

static int fail(const char *what, const char *why) {
    printf("FAIL vision_feed %s: %s\n", what, why);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 9 && argc != 10) {
        fprintf(stderr, "usage: vision_feed DIR PIXELS H W PRE POST N OUT [CHUNK]\n");
        return 2;
    }
    int H = atoi(argv[3]), W = atoi(argv[4]), pre = atoi(argv[5]), post = atoi(argv[6]), N = atoi(argv[7]);
    char err[1024];
    ds41_load_params lp = { .exact = 1, .n_threads = 1 };
    ds41_engine *e = ds41_load(argv[1], &lp, err, sizeof err);
    if (!e) return fail("load", err);
    float *px = vision_px_read(argv[2], H, W);
    if (!px) return fail("pixels", argv[2]);
    float *span;
    int rows;
    if (ds41_image_span(e, px, H, W, &span, &rows, err, sizeof err)) return fail("span", err);
    int dim = ds41_model_dim(e), V = ds41_vocab_size(e), n = pre + rows + post;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    uint8_t *img = calloc((size_t)n, 1);
    float *emb = calloc((size_t)n * dim, sizeof(float));
    float *out = malloc((size_t)N * V * sizeof(float));
    if (!ids || !img || !emb || !out) return fail("alloc", "out of memory");
    for (int i = 0; i < pre; i++) ids[i] = 1 + 7 * i % 400;
    for (int i = 0; i < rows; i++) {
        ids[pre + i] = ds41_image_token_id(e);
        img[pre + i] = 1;
        memcpy(emb + (size_t)(pre + i) * dim, span + (size_t)i * dim, (size_t)dim * sizeof(float));
    }
    for (int i = 0; i < post; i++) ids[pre + rows + i] = 3 + 11 * i % 400;
    ds41_session_params sp = { 0 };
    ds41_session_params sc = sp;
    if (argc == 10) sc.chunk = atoi(argv[9]);
    ds41_session *s = ds41_session_open(e, &sc, err, sizeof err);
    if (!s) return fail("session", err);
    if (ds41_feed_embeds(s, ids, (size_t)n, emb, img)) return fail("feed_embeds", ds41_session_error(s));
    memcpy(out, ds41_logits(s), (size_t)V * sizeof(float));
    for (int k = 1; k < N; k++) {
        int32_t t = vision_px_argmax(out + (size_t)(k - 1) * V, V);
        if (ds41_feed(s, &t, 1)) return fail("decode", ds41_session_error(s));
        memcpy(out + (size_t)k * V, ds41_logits(s), (size_t)V * sizeof(float));
    }
    FILE *f = fopen(argv[8], "wb");
    if (!f || fwrite(out, sizeof(float), (size_t)N * V, f) != (size_t)N * V || fclose(f)) return fail("write", argv[8]);
    /* text only: ds41_feed_embeds with no image row is ds41_feed */
    ds41_session *a = ds41_session_open(e, &sp, err, sizeof err), *b = ds41_session_open(e, &sp, err, sizeof err);
    if (!a || !b) return fail("session", err);
    memset(img, 0, (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = 5 + 13 * i % 400;
    if (ds41_feed(a, ids, (size_t)n) || ds41_feed_embeds(b, ids, (size_t)n, emb, img))
        return fail("text feed", "feed failed");
    if (memcmp(ds41_logits(a), ds41_logits(b), (size_t)V * sizeof(float)))
        printf("FAIL vision_feed text_only: ds41_feed_embeds without image rows differs from ds41_feed\n");
    else
        printf("PASS vision_feed text_only_bit_identical\n");
    ds41_session_close(a);
    ds41_session_close(b);
    ds41_session_close(s);
    ds41_unload(e);
    free(px); free(span); free(ids); free(img); free(emb); free(out);
    return 0;
}
