/* ds41 serve: grammar masks computed beside the forward (serve_gprefetch.h). */
#include "serve_gprefetch.h"

#include <pthread.h>
#include <stdlib.h>

enum { JOB_MAX = 4096 };

struct ds41_gprefetch {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ds41_gmatch *gm[JOB_MAX];
    int state[JOB_MAX];
    int n, next, busy, quit;
    long long done;
};

static void *helper(void *arg) {
    ds41_gprefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->next == p->n && !p->quit) pthread_cond_wait(&p->cv, &p->mu);
        if (p->next == p->n) break;
        int i = p->next++;
        p->busy = 1;
        pthread_mutex_unlock(&p->mu);
        int done = ds41_gmatch_prefetch(p->gm[i], p->state[i]);
        pthread_mutex_lock(&p->mu);
        p->busy = 0;
        p->done += done;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ds41_gprefetch *ds41_gprefetch_start(void) {
    ds41_gprefetch *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, helper, p)) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return NULL;
    }
    return p;
}

void ds41_gprefetch_stop(ds41_gprefetch *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    p->n = p->next;   /* what is queued and not started is dropped */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int ds41_gprefetch_submit(ds41_gprefetch *p, ds41_gmatch *const *gm, const int *state, int n) {
    if (n > JOB_MAX) n = JOB_MAX;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < n; i++) { p->gm[i] = gm[i]; p->state[i] = state[i]; }
    p->n = n;
    p->next = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return n;
}

void ds41_gprefetch_wait(ds41_gprefetch *p) {
    pthread_mutex_lock(&p->mu);
    while (p->next < p->n || p->busy) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

long long ds41_gprefetch_count(ds41_gprefetch *p) {
    pthread_mutex_lock(&p->mu);
    long long d = p->done;
    pthread_mutex_unlock(&p->mu);
    return d;
}
