/* vision_ask: asks a model questions about images through the library's image path
 * (ds41_image_span, ds41_feed_embeds), greedy, for tools/train/vision_eval.py.
 *   vision_ask DIR [--exact] < JOBS
 * JOBS: one question a line, "PIXELS H W PRE POST N": PIXELS a raw BF16 [3, H, W] file, PRE and
 * POST comma-separated token ids before and after the image span (every span position the
 * config's image_token_id), N the most tokens to generate. Prints one line a job: the generated
 * ids, comma-separated, up to and without the end-of-sentence id 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds41.h"
#include "vision_px.h"

#define MAXIDS 512

static int parse_ids(char *s, int32_t *ids) {
    int n = 0;
    for (char *t = strtok(s, ","); t && n < MAXIDS; t = strtok(NULL, ",")) ids[n++] = atoi(t);
    return n;
}

static int ask(ds41_engine *e, const char *path, int H, int W, const int32_t *pre, int npre, const int32_t *post,
               int npost, int N) {
    char err[1024];
    float *px = vision_px_read(path, H, W);
    if (!px) {
        fprintf(stderr, "vision_ask: %s: cannot read %zu BF16 values\n", path, (size_t)3 * H * W);
        return -1;
    }
    float *span;
    int rows;
    if (ds41_image_span(e, px, H, W, &span, &rows, err, sizeof err)) {
        fprintf(stderr, "vision_ask: %s: %s\n", path, err);
        return -1;
    }
    int dim = ds41_model_dim(e), V = ds41_vocab_size(e), n = npre + rows + npost;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    uint8_t *img = calloc((size_t)n, 1);
    float *emb = calloc((size_t)n * dim, sizeof(float));
    if (!ids || !img || !emb) return -1;
    memcpy(ids, pre, (size_t)npre * sizeof *ids);
    for (int i = 0; i < rows; i++) {
        ids[npre + i] = ds41_image_token_id(e);
        img[npre + i] = 1;
        memcpy(emb + (size_t)(npre + i) * dim, span + (size_t)i * dim, (size_t)dim * sizeof(float));
    }
    memcpy(ids + npre + rows, post, (size_t)npost * sizeof *ids);
    ds41_session_params sp = { 0 };
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    int rc = 0;
    if (!s || ds41_feed_embeds(s, ids, (size_t)n, emb, img)) {
        fprintf(stderr, "vision_ask: feed: %s\n", s ? ds41_session_error(s) : err);
        rc = -1;
    }
    for (int k = 0; k < N && rc == 0; k++) {
        int32_t t = vision_px_argmax(ds41_logits(s), V);
        if (t == 1) break;
        printf("%s%d", k ? "," : "", t);
        if (ds41_feed(s, &t, 1)) rc = -1;
    }
    printf("\n");
    fflush(stdout);
    if (s) ds41_session_close(s);
    free(px); free(span); free(ids); free(img); free(emb);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "--exact"))) {
        fprintf(stderr, "usage: vision_ask DIR [--exact] < JOBS (lines: PIXELS H W PRE POST N)\n");
        return 2;
    }
    char err[1024];
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = argc == 3;
    ds41_engine *e = ds41_load(argv[1], &lp, err, sizeof err);
    if (!e) {
        fprintf(stderr, "vision_ask: %s\n", err);
        return 1;
    }
    char line[8192], path[4096], pre_s[4096], post_s[4096];
    static int32_t pre[MAXIDS], post[MAXIDS];
    int H, W, N, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "%4095s %d %d %4095s %4095s %d", path, &H, &W, pre_s, post_s, &N) != 6) {
            fprintf(stderr, "vision_ask: bad job line: %s", line);
            rc = 1;
            break;
        }
        int npre = parse_ids(pre_s, pre), npost = parse_ids(post_s, post);
        if (ask(e, path, H, W, pre, npre, post, npost, N)) rc = 1;
    }
    ds41_unload(e);
    return rc;
}
