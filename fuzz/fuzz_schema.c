/* libFuzzer harness for the JSON Schema and regex translators (src/text/grammar_json.c,
 * grammar_regex.c): each input is given as a schema and as a regex. A refusal must come with a
 * one-line message; an accepted one must produce GBNF that the compiler accepts, except at its
 * limits or for a repeated item that can match nothing (a regex like (a|)+, refused there as
 * left recursion with its own message). */
#include "grammar.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(char *gb, const char *err) {
    if (!gb) {
        if (!err[0]) abort();
        for (const char *p = err; *p; p++) if ((unsigned char)*p < 0x20) abort();
        return;
    }
    char e2[256] = "";
    ds41_grammar *g = ds41_grammar_gbnf(gb, strlen(gb), e2, sizeof e2);
    if (!g && !strstr(e2, "limit") && !strstr(e2, "more than") && !strstr(e2, "out of memory") &&
        !strstr(e2, "left-recursive"))
        abort();
    ds41_grammar_free(g);
    free(gb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256] = "";
    check(ds41_schema_to_gbnf((const char *)data, size, err, sizeof err), err);
    err[0] = 0;
    check(ds41_regex_to_gbnf((const char *)data, size, err, sizeof err), err);
    return 0;
}
