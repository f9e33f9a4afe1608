/* ds41 thread pool: persistent workers, static split of [0, n).
 *
 * Worker i of an nt-thread pool always gets the chunk [n*i/nt, n*(i+1)/nt): the split depends
 * only on n and the thread count, so any kernel whose per-index work is independent of the
 * split (every exact kernel splits over output rows only) gives results identical to one
 * thread, and every kernel is deterministic for a given thread count.
 *
 * Workers sleep on a condition variable between jobs (a spin phase would burn the shared
 * cores between the many small linears of a decode step). The calling thread takes chunk 0
 * itself. A call made from inside a job (nested parallelism) runs serially in the caller. */
#include "kernels.h"

#include <pthread.h>
#include <stdlib.h>

struct ds41_pool {
    int n_threads;                 /* including the caller */
    pthread_t *threads;            /* n_threads - 1 workers */
    pthread_mutex_t mu;            /* guards the job fields below */
    pthread_cond_t start_cv, done_cv;
    pthread_mutex_t submit_mu;     /* one job at a time from any number of callers */
    unsigned long generation;      /* bumped per job */
    int pending;                   /* workers still running the current job */
    int quit;
    int n;
    void (*fn)(void *arg, int i0, int i1);
    void *arg;
};

typedef struct worker_arg { ds41_pool *p; int index; } worker_arg;

static __thread int in_pool_job;   /* set while this thread runs a chunk */

static void run_chunk(ds41_pool *p, int index, int n, void (*fn)(void *, int, int), void *arg) {
    long long nt = p->n_threads;
    int i0 = (int)((long long)n * index / nt);
    int i1 = (int)((long long)n * (index + 1) / nt);
    if (i1 > i0) {
        in_pool_job = 1;
        fn(arg, i0, i1);
        in_pool_job = 0;
    }
}

static void *worker_main(void *v) {
    worker_arg wa = *(worker_arg *)v;
    free(v);
    ds41_pool *p = wa.p;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        int n = p->n;
        void (*fn)(void *, int, int) = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        run_chunk(p, wa.index, n, fn, arg);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ds41_pool *ds41_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    ds41_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->submit_mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) { ds41_pool_destroy(p); return NULL; }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) { p->n_threads = i; ds41_pool_destroy(p); return NULL; }
            wa->p = p;
            wa->index = i;
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n_threads = i;   /* destroy joins only the workers that exist */
                ds41_pool_destroy(p);
                return NULL;
            }
        }
    }
    return p;
}

void ds41_pool_destroy(ds41_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->submit_mu);
    free(p);
}

void ds41_parallel_for(const ds41_ctx *ctx, int n, void (*fn)(void *arg, int i0, int i1), void *arg) {
    if (n <= 0) return;
    ds41_pool *p = ctx ? ctx->pool : NULL;
    if (!p || p->n_threads <= 1 || n == 1 || in_pool_job) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->submit_mu);
    pthread_mutex_lock(&p->mu);
    p->n = n;
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_chunk(p, 0, n, fn, arg);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->submit_mu);
}
