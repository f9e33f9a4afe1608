/* Per-thread scratch of the linears (kernels.h, ds41_scratch): one block of buffers per thread,
 * created on the thread's first request, grown by at least half when a request exceeds a slot
 * (so a run of growing requests reallocates a few times, not at every size), freed by the
 * thread-exit destructor of a pthread key (pool workers, side workers, server threads) or left
 * to the process exit (the main thread; still reachable through the thread's TLS then). */
#include "kernels.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct scr {
    void *p[DS41_SCR_N];
    size_t cap[DS41_SCR_N];
} scr;

static __thread scr *tls_scr;
static pthread_key_t scr_key;
static pthread_once_t scr_once = PTHREAD_ONCE_INIT;
static int scr_key_ok;

static void scr_free(void *v) {
    scr *s = v;
    if (!s) return;
    for (int i = 0; i < DS41_SCR_N; i++) free(s->p[i]);
    free(s);
    tls_scr = NULL;
}

static void scr_key_init(void) { scr_key_ok = pthread_key_create(&scr_key, scr_free) == 0; }

void *ds41_scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= DS41_SCR_N) return NULL;
    scr *s = tls_scr;
    if (!s) {
        pthread_once(&scr_once, scr_key_init);
        if (!(s = calloc(1, sizeof *s))) return NULL;
        /* without the key the block would leak at the thread's exit: then nothing is kept */
        if (!scr_key_ok || pthread_setspecific(scr_key, s) != 0) { free(s); return NULL; }
        tls_scr = s;
    }
    if (bytes == 0) bytes = 64;
    if (bytes <= s->cap[slot]) return s->p[slot];
    size_t want = s->cap[slot] + s->cap[slot] / 2;
    if (want < bytes) want = bytes;
    want = (want + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 64, want) != 0) return NULL;
    free(s->p[slot]);
    s->p[slot] = p;
    s->cap[slot] = want;
    return p;
}

size_t ds41_scratch_held(void) {
    size_t n = 0;
    for (int i = 0; tls_scr && i < DS41_SCR_N; i++) n += tls_scr->cap[i];
    return n;
}

void ds41_scratch_release(void) {
    scr *s = tls_scr;
    for (int i = 0; s && i < DS41_SCR_N; i++) {
        free(s->p[i]);
        s->p[i] = NULL;
        s->cap[i] = 0;
    }
}
