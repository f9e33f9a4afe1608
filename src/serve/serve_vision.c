/* ds41 serve: image encoding jobs (serve_vision.h). */
#include "serve_vision.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

struct ds41_vjob {
    ds41_engine *e;
    ds41_vcache *vc;
    uint8_t *const *img;
    const size_t *len;
    int n, rc, threaded;
    ds41_cli_vimage *im;
    char msg[512];
    atomic_int done;
    pthread_t th;
};

/* One image: decoded and preprocessed (its content key), its rows from the cache or else
 * through the tower (then kept in the cache). */
static int encode_one(ds41_vjob *j, int k, char *m, size_t cap) {
    ds41_cli_vimage *im = &j->im[k];
    float *px = NULL;
    int H, W, dim = ds41_model_dim(j->e);
    int rc = ds41_image_prepare(j->e, j->img[k], j->len[k], &px, &H, &W, im->key, m, cap);
    if (!rc && !ds41_vcache_get(j->vc, im->key, dim, &im->span, &im->rows)) {
        rc = ds41_image_span_apart(j->e, px, H, W, &im->span, &im->rows, m, cap);
        if (!rc) ds41_vcache_put(j->vc, im->key, dim, im->span, im->rows);
    }
    free(px);
    return rc;
}

static void encode_all(ds41_vjob *j) {
    j->rc = 0;
    for (int k = 0; k < j->n; k++) {
        char m[480];
        if (encode_one(j, k, m, sizeof m)) {
            snprintf(j->msg, sizeof j->msg, "image %d: %s", k + 1, m);
            j->rc = -1;
            break;
        }
    }
    atomic_store(&j->done, 1);
}

static void *vjob_main(void *arg) {
    encode_all(arg);
    return NULL;
}

ds41_vjob *ds41_vjob_start(ds41_engine *e, ds41_vcache *vc, uint8_t *const *img, const size_t *len, int n) {
    ds41_vjob *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->im = calloc(n > 0 ? (size_t)n : 1, sizeof *j->im);
    if (!j->im) { free(j); return NULL; }
    j->e = e;
    j->vc = vc;
    j->img = img;
    j->len = len;
    j->n = n;
    atomic_init(&j->done, 0);
    j->threaded = pthread_create(&j->th, NULL, vjob_main, j) == 0;
    if (!j->threaded) encode_all(j);
    return j;
}

int ds41_vjob_done(ds41_vjob *j) { return atomic_load(&j->done); }

int ds41_vjob_finish(ds41_vjob *j, ds41_cli_vimage **out, char *msg, size_t cap) {
    if (j->threaded) pthread_join(j->th, NULL);
    int rc = j->rc;
    *out = NULL;
    if (rc) {
        if (msg && cap) snprintf(msg, cap, "%s", j->msg);
        for (int k = 0; k < j->n; k++) ds41_cli_image_free(&j->im[k]);
        free(j->im);
    } else {
        *out = j->im;
    }
    free(j);
    return rc;
}
