/* Progress lines on stderr (cli_progress.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_progress.h"

struct ds41_progress {
    char label[96];
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, drawn;
    atomic_llong done, total;
    struct timespec t0;
};

int ds41_progress_enabled(void) {
    const char *e = getenv("DS41_PROGRESS");
    if (e && e[0] == '0') return 0;
    if (e && e[0] == '1') return 1;
    return isatty(2);
}

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void draw(ds41_progress *p) {
    double s = since(&p->t0);
    long long d = atomic_load(&p->done), n = atomic_load(&p->total);
    if (n > 0)
        fprintf(stderr, "\r\033[K%s: %lld %% (%lld / %lld), %.1f s", p->label, d * 100 / n, d, n, s);
    else
        fprintf(stderr, "\r\033[K%s: %.1f s", p->label, s);
    fflush(stderr);
    p->drawn = 1;
}

/* DS41_PROGRESS_AFTER seconds, or the value of the environment variable of that name (0: draw
 * at once, for the tests) */
static double after_s(void) {
    const char *e = getenv("DS41_PROGRESS_AFTER");
    char *end;
    double v = e ? strtod(e, &end) : -1.0;
    return e && end != e && v >= 0.0 ? v : DS41_PROGRESS_AFTER;
}

static void *loop(void *arg) {
    ds41_progress *p = arg;
    double after = after_s();
    pthread_mutex_lock(&p->mu);
    if (after <= 0.0) draw(p);
    while (!p->stop) {
        /* wake every 250 ms (a condition wait, so that the end does not wait for a sleep) */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 250000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&p->cv, &p->mu, &dl);
        if (!p->stop && since(&p->t0) >= after) draw(p);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ds41_progress *ds41_progress_start(const char *label) {
    if (!ds41_progress_enabled()) return NULL;
    ds41_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;   /* progress is a courtesy: no line rather than a failure */
    snprintf(p->label, sizeof p->label, "%s", label);
    clock_gettime(CLOCK_MONOTONIC, &p->t0);
    atomic_init(&p->done, 0);
    atomic_init(&p->total, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, loop, p)) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p);
        return NULL;
    }
    return p;
}

void ds41_progress_set(ds41_progress *p, long long done, long long total) {
    if (!p) return;
    atomic_store(&p->done, done);
    atomic_store(&p->total, total);
}

void ds41_progress_end(ds41_progress *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    if (p->drawn) { fputs("\r\033[K", stderr); fflush(stderr); }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
