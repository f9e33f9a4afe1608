/* ds41 thread pool: persistent workers, static split of [0, n).
 *
 * Worker i of an nt-thread pool always gets the chunk [n*i/nt, n*(i+1)/nt): the split depends
 * only on n and the thread count, so any kernel whose per-index work is independent of the
 * split (every exact kernel splits over output rows only) gives results identical to one
 * thread, and every kernel is deterministic for a given thread count.
 *
 * Dispatch: a decode step issues a few hundred parallel_for calls a few microseconds apart, so
 * a condition variable wake-up (tens of microseconds, and a sleeping worker lets the core's
 * clock drop) would be a visible share of the step. Workers therefore spin on the job counter
 * for a bounded time (SPIN_NS) after each job and only then sleep on a futex; the caller does
 * the same while waiting for the last worker. The spin yields the core every 64 pauses, so
 * that on an oversubscribed machine a spinning worker does not hold back the caller's serial
 * work on the same core. When no job comes within SPIN_NS the workers
 * sleep and cost nothing, so an idle process does not burn the shared cores. The calling
 * thread takes chunk 0 itself. A call made from inside a job (nested parallelism) runs
 * serially in the caller. */
#include "kernels.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Spin budget before sleeping: covers the gap between consecutive linears of a decode step
 * (norms, quantization, attention on the calling thread) without holding a core for long. */
#define SPIN_NS 200000LL

struct ds41_pool {
    int n_threads;                 /* including the caller */
    pthread_t *threads;            /* n_threads - 1 workers */
    pthread_mutex_t submit_mu;     /* one job at a time from any number of callers */
    /* job: written by the caller before gen is bumped (release), read after (acquire) */
    int n;
    void (*fn)(void *arg, int i0, int i1);
    void *arg;
    int quit;
    _Alignas(64) uint32_t gen;     /* job counter; futex word of the workers */
    _Alignas(64) uint32_t pending; /* workers still running the job; futex word of the caller */
    _Alignas(64) uint32_t caller_sleeping;
    uint32_t sleepers;             /* workers in (or about to enter) futex sleep on gen */
};

typedef struct worker_arg { ds41_pool *p; int index; } worker_arg;

static __thread int in_pool_job;   /* set while this thread runs a chunk */

static long futex(uint32_t *addr, int op, uint32_t val) {
    return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
}

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

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

/* Waits until *addr != old: spin (checking the clock every 64 pauses) then futex sleep,
 * announced in *sleepers so that the waker can skip the syscall when nobody sleeps. */
static void wait_change(uint32_t *addr, uint32_t old, uint32_t *sleepers) {
    long long t0 = -1;
    for (int i = 0;; i++) {
        if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != old) return;
        _mm_pause();
        if ((i & 63) == 63) {
            sched_yield();   /* a shared core: let a runnable thread (the caller) go first */
            long long t = mono_ns();
            if (t0 < 0) t0 = t;
            else if (t - t0 > SPIN_NS) break;
        }
    }
    __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(addr, __ATOMIC_SEQ_CST) == old) futex(addr, FUTEX_WAIT_PRIVATE, old);
    __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
}

static void *worker_main(void *v) {
    worker_arg wa = *(worker_arg *)v;
    free(v);
    ds41_pool *p = wa.p;
    uint32_t seen = 0;
    for (;;) {
        wait_change(&p->gen, seen, &p->sleepers);
        seen = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE);
        if (p->quit) break;
        run_chunk(p, wa.index, p->n, p->fn, p->arg);
        if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_SEQ_CST) == 0 &&
            __atomic_load_n(&p->caller_sleeping, __ATOMIC_SEQ_CST))
            futex(&p->pending, FUTEX_WAKE_PRIVATE, 1);
    }
    return NULL;
}

ds41_pool *ds41_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    ds41_pool *p = NULL;
    if (posix_memalign((void **)&p, 64, sizeof *p) != 0) return NULL;
    *p = (ds41_pool){ 0 };
    p->n_threads = n_threads;
    pthread_mutex_init(&p->submit_mu, NULL);
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
    pthread_mutex_lock(&p->submit_mu);
    p->quit = 1;
    __atomic_add_fetch(&p->gen, 1, __ATOMIC_RELEASE);
    futex(&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
    pthread_mutex_unlock(&p->submit_mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
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
    p->n = n;
    p->fn = fn;
    p->arg = arg;
    __atomic_store_n(&p->pending, (uint32_t)(p->n_threads - 1), __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST)) futex(&p->gen, FUTEX_WAKE_PRIVATE, INT32_MAX);
    run_chunk(p, 0, n, fn, arg);
    /* wait for the workers: spin, then sleep on pending (the last worker wakes us) */
    long long t0 = -1;
    for (int i = 0; __atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) != 0; i++) {
        _mm_pause();
        if ((i & 63) != 63) continue;
        sched_yield();
        long long t = mono_ns();
        if (t0 < 0) { t0 = t; continue; }
        if (t - t0 <= SPIN_NS) continue;
        __atomic_store_n(&p->caller_sleeping, 1, __ATOMIC_SEQ_CST);
        uint32_t v;
        while ((v = __atomic_load_n(&p->pending, __ATOMIC_SEQ_CST)) != 0) futex(&p->pending, FUTEX_WAIT_PRIVATE, v);
        __atomic_store_n(&p->caller_sleeping, 0, __ATOMIC_RELAXED);
        break;
    }
    pthread_mutex_unlock(&p->submit_mu);
}

double ds41_prof_now(void) { return (double)mono_ns() * 1e-9; }

/* ---------------------------------------------------------------- side worker (P6) */

/* One extra thread that runs one task at a time beside the caller: the caller starts a task,
 * goes on with its own work (its pool's linears), then waits for it. Wake-ups are condition
 * variables (one task per index layer of a forward, not hundreds per step). */
struct ds41_side {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*fn)(void *arg);
    void *arg;
    int busy;        /* a task was started and not yet waited for */
    int has_task;    /* the thread has not taken it yet */
    int done;
    int quit;
};

static void *side_main(void *arg) {
    ds41_side *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->has_task && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit) break;
        s->has_task = 0;
        void (*fn)(void *) = s->fn;
        void *a = s->arg;
        pthread_mutex_unlock(&s->mu);
        fn(a);
        pthread_mutex_lock(&s->mu);
        s->done = 1;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

ds41_side *ds41_side_create(void) {
    ds41_side *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, side_main, s)) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    return s;
}

void ds41_side_destroy(ds41_side *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int ds41_side_start(ds41_side *s, void (*fn)(void *arg), void *arg) {
    if (!s) return -1;
    pthread_mutex_lock(&s->mu);
    if (s->busy) { pthread_mutex_unlock(&s->mu); return -1; }
    s->busy = 1;
    s->done = 0;
    s->fn = fn;
    s->arg = arg;
    s->has_task = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void ds41_side_wait(ds41_side *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
    s->busy = 0;
    pthread_mutex_unlock(&s->mu);
}
