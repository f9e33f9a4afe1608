/* ds41 serve under mpiexec: rank 0's record of its engine calls and the followers' replay
 * (serve_mpi.h). */
#include "serve_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "serve_sched.h"

/* how long rank 0 gives the HTTP threads to answer the requests in flight after a fault */
#define FAULT_ANSWER_S 2.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- rank 0: recorder */

struct ds41_smirror {
    int32_t *w;
    size_t n, cap;
    const ds41_session **sess;    /* open sessions and their ids */
    int32_t *sid;
    int n_sess, cap_sess;
    int32_t next_id;
    double last;                  /* when the last record went out */
};

ds41_smirror *ds41_smirror_new(void) {
    ds41_smirror *m = calloc(1, sizeof *m);
    if (m) m->last = now_s();
    return m;
}

void ds41_smirror_free(ds41_smirror *m) {
    if (!m) return;
    free(m->w);
    free(m->sess);
    free(m->sid);
    free(m);
}

/* out of memory on rank 0 cannot leave the followers behind: the job ends */
static void oom(void) {
    fprintf(stderr, "ds41 serve: out of memory recording the step for the other ranks; ending the job\n");
    fflush(stderr);
    abort();
}

static void put(ds41_smirror *m, const int32_t *v, size_t k) {
    if (m->n + k > m->cap) {
        size_t nc = (m->cap ? m->cap * 2 : 1024) + k;
        int32_t *w = realloc(m->w, nc * sizeof *w);
        if (!w) oom();
        m->w = w;
        m->cap = nc;
    }
    memcpy(m->w + m->n, v, k * sizeof *v);
    m->n += k;
}

static void put1(ds41_smirror *m, int32_t v) { put(m, &v, 1); }

static void flush(ds41_smirror *m) {
    if (m->n > (size_t)INT32_MAX / 4) {
        fprintf(stderr, "ds41 serve: a step of %zu words is too large to send to the other ranks; ending the job\n", m->n);
        abort();
    }
    int32_t len = (int32_t)m->n;
    ds41_dist_bcast(&len, sizeof len);
    if (len) ds41_dist_bcast(m->w, (size_t)len * sizeof *m->w);
    m->n = 0;
    m->last = now_s();
}

static int32_t sid_of(const ds41_smirror *m, const ds41_session *s) {
    for (int i = 0; i < m->n_sess; i++)
        if (m->sess[i] == s) return m->sid[i];
    fprintf(stderr, "ds41 serve: a session the other ranks do not know was used; ending the job\n");
    abort();
}

void ds41_smirror_open(ds41_smirror *m, const ds41_session *s) {
    if (!m) return;
    if (m->n_sess == m->cap_sess) {
        int nc = m->cap_sess ? m->cap_sess * 2 : 16;
        const ds41_session **ns = realloc(m->sess, (size_t)nc * sizeof *ns);
        if (!ns) oom();
        m->sess = ns;
        int32_t *ni = realloc(m->sid, (size_t)nc * sizeof *ni);
        if (!ni) oom();
        m->sid = ni;
        m->cap_sess = nc;
    }
    int32_t id = m->next_id;
    m->next_id = (m->next_id + 1) & INT32_MAX;
    m->sess[m->n_sess] = s;
    m->sid[m->n_sess++] = id;
    int32_t v[2] = { DS41_SOP_OPEN, id };
    put(m, v, 2);
}

void ds41_smirror_close(ds41_smirror *m, const ds41_session *s) {
    if (!m) return;
    int32_t v[2] = { DS41_SOP_CLOSE, sid_of(m, s) };
    put(m, v, 2);
    for (int i = 0; i < m->n_sess; i++)
        if (m->sess[i] == s) {
            m->sess[i] = m->sess[--m->n_sess];
            m->sid[i] = m->sid[m->n_sess];
            break;
        }
}

static void put_ids(ds41_smirror *m, int op, const ds41_session *s, const int32_t *ids, size_t n) {
    if (n > (size_t)INT32_MAX) oom();
    int32_t v[3] = { op, sid_of(m, s), (int32_t)n };
    put(m, v, 3);
    put(m, ids, n);
}

void ds41_smirror_restore(ds41_smirror *m, const ds41_session *s, const int32_t *ids, size_t n) {
    if (!m) return;
    put_ids(m, DS41_SOP_RESTORE, s, ids, n);
    flush(m);   /* the restore replays through the forward */
}

void ds41_smirror_publish(ds41_smirror *m, const ds41_session *s, const int32_t *ids, size_t n) {
    if (m) put_ids(m, DS41_SOP_PUBLISH, s, ids, n);
}

void ds41_smirror_trim(ds41_smirror *m, long long bytes) {
    if (!m) return;
    uint64_t b = (uint64_t)(bytes < 0 ? 0 : bytes);
    int32_t v[3] = { DS41_SOP_TRIM, (int32_t)(uint32_t)b, (int32_t)(uint32_t)(b >> 32) };
    put(m, v, 3);
}

void ds41_smirror_step(ds41_smirror *m, const ds41_batch_item *it, int count) {
    if (!m || count < 1) return;
    int32_t v[2] = { DS41_SOP_STEP, count };
    put(m, v, 2);
    for (int i = 0; i < count; i++) {
        int32_t h[3] = { sid_of(m, it[i].s), (int32_t)it[i].n, (int32_t)it[i].ahead };
        put(m, h, 3);
        put(m, it[i].ids, it[i].n);
    }
    flush(m);
}

double ds41_smirror_beat_s(void) {
    double t = ds41_dist_timeout() / 3;
    return t < 0.05 ? 0.05 : t;
}

void ds41_smirror_beat(ds41_smirror *m) {
    if (m && now_s() - m->last >= ds41_smirror_beat_s()) flush(m);
}

void ds41_smirror_end(ds41_smirror *m) {
    if (!m) return;
    put1(m, DS41_SOP_END);
    flush(m);
}

/* ---------------------------------------------------------------- followers */

typedef struct fslots {
    ds41_session **s;
    int32_t *id;
    int n, cap;
} fslots;

static ds41_session *slot_find(const fslots *f, int32_t id) {
    for (int i = 0; i < f->n; i++)
        if (f->id[i] == id) return f->s[i];
    return NULL;
}

static int apply(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp, fslots *f, const ds41_sop *op,
                 ds41_batch_item **items, int *items_cap, char *err, size_t errcap) {
    ds41_session *s = NULL;
    if (op->op == DS41_SOP_CLOSE || op->op == DS41_SOP_RESTORE || op->op == DS41_SOP_PUBLISH) {
        s = slot_find(f, op->id);
        if (!s) return snprintf(err, errcap, "serve mirror: rank 0 named session %d, which this rank does not hold", (int)op->id), -1;
    }
    if ((op->op == DS41_SOP_RESTORE || op->op == DS41_SOP_PUBLISH || op->op == DS41_SOP_TRIM) && !pc)
        return snprintf(err, errcap, "serve mirror: rank 0 uses a prefix cache and this rank has none"), -1;
    switch (op->op) {
    case DS41_SOP_OPEN: {
        if (slot_find(f, op->id)) return snprintf(err, errcap, "serve mirror: session %d opened twice", (int)op->id), -1;
        if (f->n == f->cap) {
            int nc = f->cap ? f->cap * 2 : 16;
            ds41_session **ns = realloc(f->s, (size_t)nc * sizeof *ns);
            if (!ns) return snprintf(err, errcap, "out of memory"), -1;
            f->s = ns;
            int32_t *ni = realloc(f->id, (size_t)nc * sizeof *ni);
            if (!ni) return snprintf(err, errcap, "out of memory"), -1;
            f->id = ni;
            f->cap = nc;
        }
        char eb[512];
        ds41_session *ns = ds41_session_open(e, sp, eb, sizeof eb);
        if (!ns) return snprintf(err, errcap, "serve mirror: cannot open a session as rank 0 did: %s", eb), -1;
        f->s[f->n] = ns;
        f->id[f->n++] = op->id;
        return 0;
    }
    case DS41_SOP_CLOSE:
        ds41_session_close(s);
        for (int i = 0; i < f->n; i++)
            if (f->id[i] == op->id) {
                f->s[i] = f->s[--f->n];
                f->id[i] = f->id[f->n];
                break;
            }
        return 0;
    case DS41_SOP_RESTORE:
        ds41_prefix_restore(pc, s, op->ids, op->n);   /* a failure is rank 0's too: its session says so */
        return 0;
    case DS41_SOP_PUBLISH:
        ds41_prefix_publish(pc, s, op->ids, op->n);
        return 0;
    case DS41_SOP_TRIM:
        ds41_prefix_trim(pc, op->bytes);
        return 0;
    case DS41_SOP_STEP: {
        if (op->count > *items_cap) {
            ds41_batch_item *ni = realloc(*items, (size_t)op->count * sizeof *ni);
            if (!ni) return snprintf(err, errcap, "out of memory"), -1;
            *items = ni;
            *items_cap = op->count;
        }
        const int32_t *w = op->items;
        for (int k = 0; k < op->count; k++) {
            ds41_batch_item *b = &(*items)[k];
            memset(b, 0, sizeof *b);
            b->s = slot_find(f, w[0]);
            if (!b->s) return snprintf(err, errcap, "serve mirror: rank 0's step names session %d, which this rank does not hold", (int)w[0]), -1;
            b->n = (size_t)w[1];
            b->ahead = (size_t)w[2];
            b->ids = w + 3;
            w += 3 + b->n;
        }
        ds41_batch_step(*items, op->count);   /* per-item failures are rank 0's too */
        return 0;
    }
    default:
        return 1;   /* END */
    }
}

int ds41_smirror_follow(ds41_engine *e, ds41_prefix_cache *pc, const ds41_session_params *sp, char *err, size_t errcap) {
    /* a broken link is seen by both ends at about the same time: rank 0 answers its clients
     * (at most FAULT_ANSWER_S) and ends the job before this rank would */
    ds41_dist_set_fault_delay(FAULT_ANSWER_S + 1.0);
    fslots f = { NULL, NULL, 0, 0 };
    ds41_batch_item *items = NULL;
    int items_cap = 0, rc = -1;
    int32_t *buf = NULL;
    size_t cap = 0;
    for (;;) {
        int32_t len = 0;
        /* rank 0 beats every timeout / 3 while idle: silence past the timeout is a lost rank 0 */
        ds41_dist_bcast_wait(&len, sizeof len, ds41_dist_timeout());
        if (len < 0) { snprintf(err, errcap, "serve mirror: rank 0 sent a record of %d words", (int)len); break; }
        if (len == 0) continue;
        if ((size_t)len > cap) {
            int32_t *nb = realloc(buf, (size_t)len * sizeof *nb);
            if (!nb) { snprintf(err, errcap, "out of memory for rank 0's record of %d words", (int)len); break; }
            buf = nb;
            cap = (size_t)len;
        }
        ds41_dist_bcast(buf, (size_t)len * sizeof *buf);
        size_t at = 0;
        ds41_sop op;
        int r = 0, a = 0;
        while (a == 0 && (r = ds41_sop_next(buf, (size_t)len, &at, &op, err, errcap)) == 1)
            a = apply(e, pc, sp, &f, &op, &items, &items_cap, err, errcap);
        if (r < 0 || a < 0) break;
        if (a == 1) { rc = 0; break; }
    }
    for (int i = 0; i < f.n; i++) ds41_session_close(f.s[i]);
    free(f.s); free(f.id); free(items); free(buf);
    return rc;
}

/* ---------------------------------------------------------------- faults */

static ds41_sched *fault_sched;

static void on_fault(const char *msg) {
    /* the HTTP threads answer within a couple of seconds; the job ends after */
    if (fault_sched) ds41_sched_fail_all(fault_sched, msg, FAULT_ANSWER_S);
}

void ds41_smirror_on_fault(ds41_sched *S) {
    fault_sched = S;
    ds41_dist_set_fault_hook(S ? on_fault : NULL);
}
