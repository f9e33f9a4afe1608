/* The records rank 0's serve sends its followers under mpiexec (src/serve/serve_mpi_wire.c):
 * valid records decode to exactly their fields, every malformed one in
 * tests/malformed/serve-mirror/ (decimal words; the expected message beside them) is refused
 * with that message, and the fuzz seeds (fuzz/corpus/fuzz_serve_mirror/) decode to the end. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "serve_mpi.h"

static void valid_records(void) {
    /* OPEN 4; RESTORE 4 [10 11]; STEP {4: [12] ahead 0} {9: [1 2 3] ahead 7}; TRIM 2^32 + 5;
     * PUBLISH 4 []; CLOSE 4; END */
    const int32_t w[] = { 1, 4, 3, 4, 2, 10, 11, 6, 2, 4, 1, 0, 12, 9, 3, 7, 1, 2, 3, 5, 5, 1, 4, 4, 0, 2, 4, 7 };
    size_t n = sizeof w / sizeof *w, at = 0;
    ds41_sop op;
    char err[256] = "";
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_OPEN && op.id == 4 && at == 2, "OPEN");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_RESTORE && op.id == 4 && op.n == 2 &&
          op.ids == w + 5 && at == 7, "RESTORE");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_STEP && op.count == 2 && op.items == w + 9 &&
          at == 19, "STEP (at %zu)", at);
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_TRIM && op.bytes == (1LL << 32) + 5, "TRIM");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_PUBLISH && op.n == 0, "PUBLISH");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_CLOSE && op.id == 4, "CLOSE");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 1 && op.op == DS41_SOP_END && at == n, "END");
    CHECK(ds41_sop_next(w, n, &at, &op, err, sizeof err) == 0, "the end");
    CHECK(!err[0], "no message on valid records: %s", err);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 16);
    size_t k = b ? fread(b, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (b) b[k] = 0;
    if (len) *len = k;
    return b;
}

static void malformed_corpus(void) {
    const char *root = getenv("DS41_ROOT") ? getenv("DS41_ROOT") : ".";
    char dir[512], p[1024];
    snprintf(dir, sizeof dir, "%s/tests/malformed/serve-mirror", root);
    DIR *d = opendir(dir);
    CHECK(d, "cannot open %s", dir);
    if (!d) return;
    int cases = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s/words", dir, de->d_name);
        char *txt = slurp(p, NULL);
        snprintf(p, sizeof p, "%s/%s/expected", dir, de->d_name);
        char *want = slurp(p, NULL);
        CHECK(txt && want, "%s: words or expected missing", de->d_name);
        if (txt && want) {
            want[strcspn(want, "\n")] = 0;
            int32_t w[64];
            size_t n = 0;
            for (char *s = txt, *e; n < 64; s = e) {
                long v = strtol(s, &e, 10);
                if (e == s) break;
                w[n++] = (int32_t)v;
            }
            size_t at = 0;
            ds41_sop op;
            char err[256] = "";
            int r;
            while ((r = ds41_sop_next(w, n, &at, &op, err, sizeof err)) == 1) {}
            CHECK(r == -1, "%s: accepted", de->d_name);
            CHECK(!strcmp(err, want), "%s: message '%s', expected '%s'", de->d_name, err, want);
            cases++;
        }
        free(txt);
        free(want);
    }
    closedir(d);
    CHECK(cases >= 12, "%d malformed cases", cases);
}

static void fuzz_seeds(void) {
    const char *root = getenv("DS41_ROOT") ? getenv("DS41_ROOT") : ".";
    char dir[512], p[1024];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/fuzz_serve_mirror", root);
    DIR *d = opendir(dir);
    CHECK(d, "cannot open %s", dir);
    if (!d) return;
    int seeds = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        size_t len = 0;
        char *b = slurp(p, &len);
        CHECK(b && len % 4 == 0, "%s: not whole words", de->d_name);
        if (b) {
            const int32_t *w = (const int32_t *)(void *)b;
            size_t n = len / 4, at = 0;
            ds41_sop op;
            char err[256] = "";
            int r;
            while ((r = ds41_sop_next(w, n, &at, &op, err, sizeof err)) == 1) {}
            CHECK(r == 0 && at == n, "%s: %s", de->d_name, err);
            seeds++;
        }
        free(b);
    }
    closedir(d);
    CHECK(seeds >= 3, "%d seeds", seeds);
}

int main(void) {
    RUN_CASE(valid_records);
    RUN_CASE(malformed_corpus);
    RUN_CASE(fuzz_seeds);
    return check_exit();
}
