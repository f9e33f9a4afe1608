/* ds41 serve: image encoding jobs (serve_vision.h). */
#include "serve_vision.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

struct ds41_vjob {
    ds41_engine *e;
    uint8_t *const *img;
    const size_t *len;
    int n, rc, threaded;
    ds41_cli_vimage *im;
    char msg[512];
    atomic_int done;
    pthread_t th;
};

static void encode_all(ds41_vjob *j) {
    j->rc = 0;
    for (int k = 0; k < j->n; k++) {
        char m[480];
        if (ds41_cli_image_encode(j->e, j->img[k], j->len[k], 1, &j->im[k], m, sizeof m)) {
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

ds41_vjob *ds41_vjob_start(ds41_engine *e, uint8_t *const *img, const size_t *len, int n) {
    ds41_vjob *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->im = calloc(n > 0 ? (size_t)n : 1, sizeof *j->im);
    if (!j->im) { free(j); return NULL; }
    j->e = e;
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
