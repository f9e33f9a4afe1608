/* The malformed-input corpora under tests/malformed/: every case must be refused with a one-line
 * message containing the text of its expected file. A case is an entry of the corpus folder; its
 * expected text lives at the entry's path + `suffix` ("/expected" inside a case folder, or
 * ".expected" beside a case file; entries ending in the suffix are not cases). */
#ifndef DS41_TEST_MALFORMED_H
#define DS41_TEST_MALFORMED_H

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"

/* Loads one case: returns 0 if it was accepted (after freeing what it made), -1 with err set if
 * refused; checks anything else it must (nothing left allocated) itself. */
typedef int (*malformed_load)(const char *path, const char *name, ds41_err *err);

/* Runs every case of dir; returns the number of cases. */
static inline int malformed_corpus(const char *dir, const char *suffix, malformed_load load) {
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s", dir);
    if (!d) return 0;
    int n = 0;
    size_t sl = strlen(suffix);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t L = strlen(e->d_name);
        if (e->d_name[0] == '.' || (L >= sl && !strcmp(e->d_name + L - sl, suffix))) continue;
        char path[1400], epath[1500];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(epath, sizeof epath, "%s%s", path, suffix);
        char *expected = NULL;
        size_t len = 0;
        ds41_err err;
        if (ds41_read_file(epath, 4096, &expected, &len, &err)) {
            CHECK(0, "%s: %s", e->d_name, err.msg);
            continue;
        }
        while (len && (expected[len - 1] == '\n' || expected[len - 1] == '\r')) expected[--len] = 0;
        memset(&err, 0, sizeof err);
        int rc = load(path, e->d_name, &err);
        CHECK(rc == -1, "%s: accepted", e->d_name);
        if (rc != 0) {
            CHECK(strstr(err.msg, expected) != NULL, "%s: message '%s' lacks '%s'", e->d_name, err.msg, expected);
            CHECK(strchr(err.msg, '\n') == NULL, "%s: message is not one line", e->d_name);
        }
        free(expected);
        n++;
    }
    closedir(d);
    return n;
}

#endif
