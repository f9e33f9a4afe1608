/* Strict numeric parsing of command-line values (see cli_args.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"

int ds41_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    /* strtoll skips leading blanks and accepts an empty tail; neither is a number here */
    if (end == v || *end || isspace((unsigned char)*v) || errno || x < lo || x > hi) {
        fprintf(stderr, "ds41 %s: %s: expected an integer in %lld..%lld, got '%.40s'\n", cmd, flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int ds41_cli_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || isspace((unsigned char)*v) || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "ds41 %s: %s: expected a number in %g..%g, got '%.40s'\n", cmd, flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int ds41_cli_u64(const char *cmd, const char *flag, const char *v, unsigned long long *out) {
    char *end;
    errno = 0;
    /* strtoull accepts "-1" as 2^64-1: require a leading digit */
    unsigned long long x = isdigit((unsigned char)*v) ? strtoull(v, &end, 10) : 0;
    if (!isdigit((unsigned char)*v) || *end || errno) {
        fprintf(stderr, "ds41 %s: %s: expected an unsigned integer 0..18446744073709551615, got '%.40s'\n", cmd, flag, v);
        return -1;
    }
    *out = x;
    return 0;
}
