/* Helpers shared by the C tests that load generated checkpoints (static inline: a test uses
 * what it needs). */
#ifndef DS41_TESTUTIL_H
#define DS41_TESTUTIL_H

#include "check.h"
#include "ds41.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* getenv(name) when set and not empty, else def */
static inline const char *env_or(const char *name, const char *def) {
    const char *v = getenv(name);
    return v && *v ? v : def;
}

/* 1 inside the sanitizer pass (tests/run.sh's DS41_ASAN), where the tests run a
 * representative subset */
static inline int under_sanitizers(void) { return *env_or("DS41_ASAN", "") != 0; }

/* Writes the checkpoint of tests/configs/CONFIG (stub Engram token map) with tools/
 * make_checkpoint.py into $DS41_BUILD/test-tmp/LEAF, its path into out; reuse: keep one that
 * is already complete. 0 = ready. The files are links into tests/ckcache.sh's cache
 * (build/test-ck/gen), which writes each distinct checkpoint once for every test and both
 * builds (normal and sanitizer). */
/* write_test_ck with more make_checkpoint.py arguments (extra, e.g. "--vision") */
static inline int write_test_ck_args(const char *leaf, const char *config, int seed, int reuse, const char *extra, char *out,
                                     size_t cap) {
    const char *root = env_or("DS41_ROOT", "."), *build = env_or("DS41_BUILD", "build");
    const char *py = env_or("PYTHON", "/usr/bin/python3");
    if (build[0] == '/') snprintf(out, cap, "%s/test-tmp/%s", build, leaf);
    else snprintf(out, cap, "%s/%s/test-tmp/%s", root, build, leaf);
    char head[8192] = "";
    if (reuse) snprintf(head, sizeof head, "[ -f '%s/.complete' ] || ", out);
    char cmd[32768];
    snprintf(cmd, sizeof cmd, "%sPYTHON='%s' bash '%s/tests/ckcache.sh' '%s' '%s/tests/configs/%s' --seed %d --token-map stub -q %s",
             head, py, root, out, root, config, seed, extra);
    return system(cmd);
}

static inline int write_test_ck(const char *leaf, const char *config, int seed, int reuse, char *out, size_t cap) {
    return write_test_ck_args(leaf, config, seed, reuse, "", out, cap);
}

/* tests/configs/NAME at seed 7, written once into test-tmp/TAG_NAME */
static inline int make_ck(const char *tag, const char *name, char *dir, size_t cap) {
    char leaf[256];
    snprintf(leaf, sizeof leaf, "%s_%s", tag, name);
    return write_test_ck(leaf, name, 7, 1, dir, cap);
}

/* n pseudo-random ids below V from seed (a fixed LCG: the same ids on every machine) */
static inline void rand_ids(int32_t *v, int n, int V, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) { x = x * 1103515245u + 12345u; v[i] = (int32_t)((x >> 8) % (unsigned)V); }
}

/* the first index of the largest of v[0..n) */
static inline int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

/* dir loaded with the given kernels and context (a CHECK failure, and NULL, when it cannot be);
 */
static inline ds41_engine *load_checked(const char *dir, int exact, long long ctx) {
    ds41_load_params lp;
    ds41_load_params_default(&lp);
    lp.exact = exact;
    lp.ctx_size = ctx;
    char err[512];
    ds41_engine *e = ds41_load(dir, &lp, err, sizeof err);
    CHECK(e, "load %s: %s", dir, err);
    return e;
}

/* A session with the default parameters (draft: DSpark on), or NULL after a failed CHECK. */
static inline ds41_session *test_session(ds41_engine *e, int draft) {
    ds41_session_params sp;
    ds41_session_params_default(&sp);
    sp.draft = draft;
    char err[512];
    ds41_session *s = ds41_session_open(e, &sp, err, sizeof err);
    CHECK(s, "session: %s", err);
    return s;
}

#endif
