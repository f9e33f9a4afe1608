/* ds41 common: error reporting, checked arithmetic, small helpers.
 * Every fallible function takes a ds41_err* and returns 0 on success, -1 on
 * failure with a one-line message naming what was wrong (file, tensor, field,
 * byte offset) in err->msg. */
#ifndef DS41_COMMON_H
#define DS41_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ds41_err {
    char msg[1024];
} ds41_err;

/* Formats a message into err (if non-NULL) and returns -1. */
int ds41_errf(ds41_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Overflow-checked size arithmetic: return 0 on success, -1 on overflow. */
static inline int ds41_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int ds41_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* Reads a whole (small) file into a NUL-terminated heap buffer; caps at max_bytes. */
int ds41_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ds41_err *err);

/* Joins dir and name into a heap string (dir may or may not end in '/'). */
char *ds41_path_join(const char *dir, const char *name);

/* Logger: the only global mutable state. Level 0 = quiet, 1 = info, 2 = debug. */
extern int ds41_log_level;
void ds41_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "ds41: " + the formatted message + newline on stderr, whatever the log level (ds41_log's
 * output, and the one-process form of ds41_dist_fatal) */
void ds41_vmessage(const char *fmt, va_list ap);

#endif
