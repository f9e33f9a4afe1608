/* Minimal test helpers. A test program prints one line per case:
 *   PASS <name>      or      FAIL <name>: <why>
 * tests/run.sh counts those lines over every test program. */
#ifndef DS41_CHECK_H
#define DS41_CHECK_H

#include <stdio.h>

static int check_failures_in_case;
static int check_total_failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            if (check_failures_in_case++ < 5) {                                 \
                fprintf(stdout, "  check failed at %s:%d: ", __FILE__, __LINE__); \
                fprintf(stdout, __VA_ARGS__);                                   \
                fputc('\n', stdout);                                            \
            }                                                                   \
        }                                                                       \
    } while (0)

#define CASE_BEGIN() (check_failures_in_case = 0)
static inline void case_end(const char *name) {
    if (check_failures_in_case) {
        printf("FAIL %s: %d checks failed\n", name, check_failures_in_case);
        check_total_failed++;
    } else {
        printf("PASS %s\n", name);
    }
    fflush(stdout);
}
#define RUN_CASE(fn) do { CASE_BEGIN(); fn(); case_end(#fn); } while (0)
static inline int check_exit(void) { return check_total_failed ? 1 : 0; }

#endif
