/* ds41 serve --role prefill|decode (docs/pd.md): the glue between the server and src/pd/.
 * Built with UCX (DS41_HAVE_UCX, Makefile); without it the roles say so and exit. */
#define _GNU_SOURCE
#include "serve.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_sched.h"

#ifdef DS41_HAVE_UCX
#include "pd.h"

typedef struct prefill_run {
    ds41_engine *e;
    ds41_prefix_cache *pc;
    const ds41_serve_opts *o;
    volatile sig_atomic_t stop;
    int rc;
    ds41_err err;
} prefill_run;

static void *prefill_main(void *arg) {
    prefill_run *r = arg;
    ds41_pd_prefill_opts po = { .host = r->o->host, .port = r->o->port, .capacity = r->o->parallel,
                                .lease_ms = r->o->lease_ms, .decoder_on_decode = r->o->pd_decoder_decode };
    r->rc = ds41_pd_prefill_run(r->e, r->pc, &r->o->sp, &po, &r->stop, &r->err);
    if (r->rc) {
        fprintf(stderr, "ds41 serve --role prefill: %s\n", r->err.msg);
        kill(getpid(), SIGTERM);   /* wakes the sigwait of the main thread */
    }
    return NULL;
}

int ds41_serve_pd_prefill(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, const void *ss) {
    prefill_run r = { .e = e, .pc = pc, .o = o };
    pthread_t th;
    if (pthread_create(&th, NULL, prefill_main, &r)) { fprintf(stderr, "ds41 serve: cannot start the prefill node\n"); return 1; }
    int sig = 0;
    sigwait((const sigset_t *)ss, &sig);
    r.stop = 1;
    pthread_join(th, NULL);
    return r.rc ? 1 : 0;
}

/* the scheduler's remote interface (serve_sched.h) over ds41_pd_start (src/pd/pd.h) */
static int g_fail;
static void *job_start(void *ctx, ds41_session *s, const int32_t *ids, size_t n_prompt, size_t n_fetch, long long first) {
    return ds41_pd_start(ctx, s, ids, n_prompt, n_fetch, first, g_fail);
}

static int job_poll(void *job, long long *bytes, double *seconds, long long *hit, char *msg, size_t cap) {
    ds41_pd_result res;
    int st = ds41_pd_poll(job, &res, msg, cap);
    if (st != 0) { *bytes = res.bytes; *seconds = res.seconds; *hit = res.restored; }
    return st;
}

static void job_finish(void *job) { ds41_pd_finish(job); }

int ds41_serve_pd_decode(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, ds41_sched_params *sp,
                         void **client) {
    ds41_err err;
    if (!o->prefill_nodes) { fprintf(stderr, "ds41 serve: --role decode needs --prefill HOST:PORT[,...]\n"); return -1; }
    ds41_pd_client *cl = ds41_pd_client_open(e, pc, o->prefill_nodes, o->prefill_timeout_ms, &err);
    if (!cl) { fprintf(stderr, "ds41 serve: %s\n", err.msg); return -1; }
    sp->remote.ctx = cl;
    sp->remote.start = job_start;
    sp->remote.poll = job_poll;
    sp->remote.finish = job_finish;
    sp->remote.min_tokens = o->remote_min;
    sp->remote.fail = o->on_failure_fail;
    g_fail = o->on_failure_fail;
    *client = cl;
    fprintf(stderr, "ds41 serve: decode node: remote prefill on %s for prompts with at least %lld new tokens, "
            "on failure %s, timeout %d ms\n", o->prefill_nodes, o->remote_min, o->on_failure_fail ? "fail" : "local",
            o->prefill_timeout_ms);
    return 0;
}

void ds41_serve_pd_close(void *client) { ds41_pd_client_close(client); }

#else

static int no_ucx(void) {
    fprintf(stderr, "ds41 serve: --role prefill|decode needs UCX, and this ds41 was built without it "
            "(install libucx-dev, then make)\n");
    return 1;
}
int ds41_serve_pd_prefill(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, const void *ss) {
    (void)e; (void)pc; (void)o; (void)ss;
    return no_ucx();
}
int ds41_serve_pd_decode(ds41_engine *e, ds41_prefix_cache *pc, const ds41_serve_opts *o, ds41_sched_params *sp,
                         void **client) {
    (void)e; (void)pc; (void)o; (void)sp; (void)client;
    return -no_ucx();
}
void ds41_serve_pd_close(void *client) { (void)client; }

#endif
